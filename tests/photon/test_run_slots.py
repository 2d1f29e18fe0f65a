"""The run queue `photon up` configures (photon/deployment.py: instance_yaml): two slots for the work
units, one run at a time of the work kept off the click path (query runs among it). Judged by Dagster's
own counter of tag limits, the one its queued run coordinator applies, over runs tagged as the
dispatchers and jobs tag them."""

from pathlib import Path

import yaml
from dagster._utils.tags import TagConcurrencyLimitsCounter  # what QueuedRunCoordinatorDaemon applies

from photon.deployment import instance_yaml
from photon_assets.jobs import OFF_CLICK_PATH_TAGS, REGISTRY_TAGS, STREAM_JOBS, ingest_queries_job, join_clicks_job
from sensors.dispatcher import work_unit_request

QUEUE = yaml.safe_load(instance_yaml(Path("/tmp/d"), Path("/tmp/s")))["run_coordinator"]["config"]


class Run:  # what the counter reads of a run
    def __init__(self, tags: dict):
        self.tags = tags


def work_unit_run(stream: str, unit_id: str, embedded_registry: bool = False) -> Run:
    """A work unit's run: its job's tags, then its request's. Under `photon up` the registry is the
    service (PHOTON_REGISTRY_ADDRESS), and the jobs carry no registry tag; with the embedded one
    (`dagster dev` alone), they do."""
    request = work_unit_request("dc1", stream, "log_ranges", unit_id, [("f.jsonl", 0, 10)])
    assert request.job_name == STREAM_JOBS[stream][0]
    job = {"query": ingest_queries_job, "click": join_clicks_job}[stream]
    job_tags = {k: v for k, v in job.tags.items() if embedded_registry or k not in REGISTRY_TAGS}
    return Run({**job_tags, **({"photon/uses_registry": "true"} if embedded_registry else {}), **request.tags})


def launchable(in_progress: list[Run], queued: list[Run]) -> list[Run]:
    """The queued runs one dequeue would launch, in order, as the coordinator does."""
    counter = TagConcurrencyLimitsCounter(QUEUE["tag_concurrency_limits"], in_progress)
    launched = []
    for run in queued:
        if len(in_progress) + len(launched) >= QUEUE["max_concurrent_runs"]:
            break
        if not counter.is_blocked(run):
            counter.update_counters_with_launched_item(run)
            launched.append(run)
    return launched


def test_work_units_take_two_slots_and_the_work_off_the_click_path_one_run_at_a_time():
    query, click = work_unit_run("query", "dc1.query.000001"), work_unit_run("click", "dc1.click.000001")
    click_2, query_2 = work_unit_run("click", "dc1.click.000002"), work_unit_run("query", "dc1.query.000002")
    refresh, check = Run(dict(OFF_CLICK_PATH_TAGS)), Run({**OFF_CLICK_PATH_TAGS, "photon/kind": "checks"})

    # Beside a click run, one run off the click path: the query run (its priority), not the refresh too.
    assert launchable([click], [query_2, refresh]) == [query_2]
    # A query run waits for a maintenance or refresh run in flight; the click runs do not.
    assert launchable([refresh], [query, click, click_2]) == [click, click_2]
    # And the refresh for a query run in flight: a click run never has two such runs beside it.
    assert launchable([query], [check, click_2]) == [click_2]
    # Nothing else running: two work units at once, not three, and never two query runs.
    assert launchable([], [query, query_2, click, click_2]) == [query, click]


def test_with_the_embedded_registry_one_work_unit_at_a_time():
    units = [work_unit_run("query", "dc1.query.000001", True), work_unit_run("click", "dc1.click.000001", True)]
    refresh = Run(dict(OFF_CLICK_PATH_TAGS))
    assert launchable([], [*units, refresh]) == [units[0]]
    assert launchable([units[1]], [refresh]) == [refresh]
