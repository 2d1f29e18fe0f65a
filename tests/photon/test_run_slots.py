"""The run queue `photon up` configures (photon/deployment.py: instance_yaml): two slots for the work
units, the third for the work kept off the click path. Judged by Dagster's own counter of tag limits,
the one its queued run coordinator applies, over runs tagged as the dispatchers and jobs tag them."""

from pathlib import Path

import yaml
from dagster._utils.tags import TagConcurrencyLimitsCounter  # what QueuedRunCoordinatorDaemon applies

from photon.deployment import instance_yaml
from photon_assets.jobs import OFF_CLICK_PATH_TAGS, REGISTRY_TAGS, STREAM_JOBS, WORK_UNIT_TAGS
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
    job_tags = {k: v for k, v in WORK_UNIT_TAGS.items() if embedded_registry or k not in REGISTRY_TAGS}
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


def test_work_units_take_two_slots_and_the_work_off_the_click_path_the_third():
    query, click = work_unit_run("query", "dc1.query.000001"), work_unit_run("click", "dc1.click.000001")
    more_units = [work_unit_run("click", "dc1.click.000002"), work_unit_run("query", "dc1.query.000002")]
    refresh, check = Run(dict(OFF_CLICK_PATH_TAGS)), Run({**OFF_CLICK_PATH_TAGS, "photon/kind": "checks"})

    # Under load: work units queued first (their priority), yet a run off the click path starts.
    assert launchable([query, click], [*more_units, refresh]) == [refresh]
    # And never two off the click path: the work units' slots stay theirs.
    assert launchable([], [refresh, check, *more_units]) == [refresh, *more_units]
    # Nothing else running: two work units at once, not three.
    assert launchable([], [query, click, *more_units]) == [query, click]


def test_with_the_embedded_registry_one_work_unit_at_a_time():
    units = [work_unit_run("query", "dc1.query.000001", True), work_unit_run("click", "dc1.click.000001", True)]
    refresh = Run(dict(OFF_CLICK_PATH_TAGS))
    assert launchable([], [*units, refresh]) == [units[0], refresh]
