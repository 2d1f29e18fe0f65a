import json
import threading
import time
from functools import partial

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test

from photon_assets.jobs import INGEST_QUERIES_JOB, JOIN_CLICKS_JOB
from photon_assets.work_unit import PENDING_RETRY, TAG_ATTEMPT, TAG_DC, TAG_KIND, TAG_STREAM, TAG_WORK_UNIT
from resources.event_store.progress import QueryProgress, QueryTail, WriterProgress
from resources.id_registry import IdRegistryResource, close_embedded_registries
from resources.registry.ownership import preferred_dc
from resources.settings import PipelineSettings
from resources.state.layout import DataLayout
from resources.state.sidecars import EventTimeWatermark
from resources.state.watermark import WatermarkRule
from resources.state.work_unit_log import WorkUnit, WorkUnitLog
from sensors.deps import SensorDeps
from sensors.dispatcher import log_dispatcher, pending_dispatcher
from sensors.retries import plan_retries
from spark_ops.pending import PendingDigest, pending_retry_decision
from tests.conftest import click, query, write_lines


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def evaluate(make_sensor, instance, cursor=None, registry: IdRegistryResource | None = None, **settings) -> dg.SensorResult:
    """One tick of the sensor `make_sensor(deps)` makes, with these settings (the code location makes its
    sensors once, with the deployment's)."""
    # With one replica the click dispatcher never reaches the registry; an embedded one otherwise.
    registry = registry or IdRegistryResource(data_dir=instance.root_directory)
    sensor = make_sensor(SensorDeps(PipelineSettings(**settings), registry.get))
    return sensor(dg.build_sensor_context(instance=instance, cursor=cursor))


def test_new_complete_lines_become_work_units_with_stable_run_keys(tmp_path, instance):
    click_dir = tmp_path / "logs" / "dc1" / "click"
    clicks = [click(f"10.0.0.1:1:{i}", "10.0.0.2:2:1", i) for i in range(20)]
    write_lines(click_dir / "w1" / "00000.jsonl", clicks[:10], torn='{"click_id": "10.0.')
    write_lines(click_dir / "w2" / "00000.jsonl", clicks[10:])
    sensor = partial(log_dispatcher, "dc1", "click", str(tmp_path))

    first = evaluate(sensor, instance, click_work_unit_bytes=1200, click_catch_up_work_unit_bytes=0,
                     pacing_max_hold_seconds=0)
    keys = [r.run_key for r in first.run_requests]
    assert keys == [f"dc1.click.{i:08d}" for i in range(len(keys))] and len(keys) >= 2
    ranges = [rng for r in first.run_requests for rng in r.run_config["ops"]["join_clicks"]["config"]["ranges"]]
    covered = {f: sum(r["end"] - r["start"] for r in ranges if r["file"] == f) for f in {r["file"] for r in ranges}}
    torn_file = click_dir / "w1" / "00000.jsonl"
    assert covered["w1/00000.jsonl"] == torn_file.stat().st_size - len('{"click_id": "10.0.')  # torn line left
    assert covered["w2/00000.jsonl"] == (click_dir / "w2" / "00000.jsonl").stat().st_size
    assert all(r.tags[TAG_DC] == "dc1" and r.job_name == JOIN_CLICKS_JOB for r in first.run_requests)
    cursor = json.loads(first.cursor)
    assert cursor == {"requested": len(keys), "held": {}, "paced_ticks": 0, "waiting": {}, "v": 1}

    # Nothing new: nothing requested. A tick that lost its cursor re-requests the same keys.
    assert evaluate(sensor, instance, cursor=first.cursor, pacing_max_hold_seconds=0).run_requests == []
    assert [r.run_key for r in evaluate(sensor, instance, pacing_max_hold_seconds=0).run_requests] == keys

    # The torn line completes: one more work unit, starting exactly where the last one ended.
    with open(torn_file, "a") as f:
        f.write('0.1:1:99", "query_id": "10.0.0.2:2:1", "timestamp_us": 99, "ad_id": "a", '
                '"advertiser_id": "b", "cost_micros": 1}\n')
    later = evaluate(sensor, instance, cursor=first.cursor, pacing_max_hold_seconds=0)
    [new] = later.run_requests
    [rng] = new.run_config["ops"]["join_clicks"]["config"]["ranges"]
    assert rng["file"] == "w1/00000.jsonl" and rng["end"] == torn_file.stat().st_size
    assert rng["start"] == covered["w1/00000.jsonl"]


def test_a_backlog_is_cut_into_catch_up_work_units(tmp_path, instance):
    lines = [click(f"10.0.0.1:1:{i}", "10.0.0.2:2:1", i) for i in range(40)]

    def unit_sizes(name: str, normal: int, catch_up: int) -> list[int]:
        # Each variant in its own data dir: work units, once cut, are durable.
        write_lines(tmp_path / name / "logs" / "dc1" / "click" / "w1" / "00000.jsonl", lines)
        sensor = partial(log_dispatcher, "dc1", "click", str(tmp_path / name))
        requests = evaluate(sensor, instance, pacing_max_hold_seconds=0, click_work_unit_bytes=normal,
                            click_catch_up_work_unit_bytes=catch_up).run_requests
        ranges = [q.run_config["ops"]["join_clicks"]["config"]["ranges"] for q in requests]
        return [sum(r["end"] - r["start"] for r in unit) for unit in ranges]

    normal = unit_sizes("normal", 1000, 0)
    backlog = sum(normal)
    assert max(normal) <= 1000 and len(normal) >= 4
    catching_up = unit_sizes("catching_up", 1000, backlog // 2)
    assert sum(catching_up) == backlog
    assert len(catching_up) in (2, 3) and max(catching_up) > 1000
    # A catch-up size above the backlog: the whole backlog is one work unit.
    assert unit_sizes("all_in_one", 1000, backlog * 2) == [backlog]
    # A little more than one normal unit's worth waiting: one unit, not a full one and a remainder.
    few = backlog // 2 + 200
    assert len(unit_sizes("few_normal", few, 0)) == 2
    assert unit_sizes("just_over_one_unit", few, backlog * 2) == [backlog]


def test_query_dispatcher_targets_the_ingest_job(tmp_path, instance):
    write_lines(tmp_path / "logs" / "dc2" / "query" / "w" / "0.jsonl", [query("10.0.0.2:2:1", 1)])
    result = evaluate(partial(log_dispatcher, "dc2", "query", str(tmp_path)), instance)
    [request] = result.run_requests
    assert request.job_name == INGEST_QUERIES_JOB and request.run_key == "dc2.query.00000000"
    assert request.tags[TAG_STREAM] == "query"


def test_back_pressure_cuts_nothing_while_the_dispatchers_own_run_is_unfinished(tmp_path, instance):
    """Under the daemon, runs wait in a queue: while one of its own is queued or running, a
    dispatcher cuts nothing, and what arrived meanwhile is cut afterwards as one catch-up unit."""
    writer_dir = tmp_path / "logs" / "dc1" / "query" / "w"
    write_lines(writer_dir / "0.jsonl", [query(f"10.0.0.2:2:{i}", i) for i in range(3)])
    sensor = partial(log_dispatcher, "dc1", "query", str(tmp_path))
    sizes = {"query_work_unit_bytes": 600, "query_catch_up_work_unit_bytes": 1 << 20}
    first = evaluate(sensor, instance, **sizes)
    [request] = first.run_requests
    create_run_for_test(instance, job_name=INGEST_QUERIES_JOB, status=dg.DagsterRunStatus.STARTED, tags=request.tags)
    write_lines(writer_dir / "1.jsonl", [query(f"10.0.0.2:2:{i}", i) for i in range(3, 30)])

    held = evaluate(sensor, instance, cursor=first.cursor, **sizes)
    assert held.run_requests == []
    assert held.skip_reason.skip_message == ("back-pressure: 1 work unit(s) of logs/dc1/query/ queued or running; "
                                "new lines are cut when one finishes")
    # A run of another stream, or no limit: the new lines are cut, as one catch-up unit.
    assert evaluate(partial(log_dispatcher, "dc1", "click", str(tmp_path)), instance).skip_reason.skip_message.startswith("no new")
    [caught_up] = evaluate(sensor, instance, cursor=held.cursor, dispatcher_max_in_flight=0, **sizes).run_requests
    [unit] = [caught_up.run_config["ops"]["ingest_query_logs"]["config"]["ranges"]]
    assert [(r["file"], r["start"], r["end"]) for r in unit] == [("w/1.jsonl", 0, (writer_dir / "1.jsonl").stat().st_size)]


def test_under_the_daemon_a_click_tick_waits_for_its_run_in_flight_to_end_and_cuts_at_once(tmp_path, instance):
    """The daemon ticks sensors every 5 s at most: a click log dispatcher it ticks, held back by its
    run in flight, waits for that run to end (up to dispatcher_tick_wait_seconds) and cuts what
    arrived meanwhile in the same tick; with the run never ending, it gives up at the wait's end."""
    click_dir = tmp_path / "logs" / "dc1" / "click" / "w"
    write_lines(click_dir / "0.jsonl", [click(f"10.0.0.1:1:{i}", "10.0.0.2:2:1", i) for i in range(3)])
    registry = IdRegistryResource(data_dir=instance.root_directory)
    settings = PipelineSettings(pacing_max_hold_seconds=0, dispatcher_tick_wait_seconds=3.5)
    sensor = log_dispatcher("dc1", "click", str(tmp_path), SensorDeps(settings, registry.get, ticked_by_daemon=True))
    first = sensor(dg.build_sensor_context(instance=instance))
    [request] = first.run_requests
    run = create_run_for_test(instance, job_name=JOIN_CLICKS_JOB, status=dg.DagsterRunStatus.STARTED, tags=request.tags)
    write_lines(click_dir / "1.jsonl", [click(f"10.0.0.1:1:{i}", "10.0.0.2:2:1", i) for i in range(3, 6)])

    def run_ends():
        time.sleep(0.5)  # the run's work
        instance.report_dagster_event(dg.DagsterEvent(event_type_value="PIPELINE_SUCCESS", job_name=JOIN_CLICKS_JOB),
                                      run.run_id)

    ender = threading.Thread(target=run_ends)
    started = time.monotonic()
    ender.start()
    second = sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
    [cut] = second.run_requests
    waited = time.monotonic() - started
    ender.join()
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.SUCCESS
    assert 0.5 <= waited < 3.5
    ranges = cut.run_config["ops"]["join_clicks"]["config"]["ranges"]
    assert [(r["file"], r["start"]) for r in ranges] == [("w/1.jsonl", 0)]

    # A run that does not end: the tick gives up after the wait, held back as before.
    create_run_for_test(instance, job_name=JOIN_CLICKS_JOB, status=dg.DagsterRunStatus.STARTED, tags=cut.tags)
    write_lines(click_dir / "2.jsonl", [click("10.0.0.1:1:9", "10.0.0.2:2:1", 9)])
    short = log_dispatcher("dc1", "click", str(tmp_path), SensorDeps(
        PipelineSettings(pacing_max_hold_seconds=0, dispatcher_tick_wait_seconds=0.3), registry.get, ticked_by_daemon=True))
    started = time.monotonic()
    held = short(dg.build_sensor_context(instance=instance, cursor=second.cursor))
    assert held.run_requests == [] and held.skip_reason.skip_message.startswith("back-pressure: 1 work unit(s)")
    assert time.monotonic() - started >= 0.3


def failed_run(instance, unit: str, attempt: int, stream: str = "click"):
    config = {"ops": {"join_clicks": {"config": {"dc": "dc1", "work_unit": unit, "attempt": attempt, "ranges": []}}}}
    return create_run_for_test(
        instance,
        job_name=JOIN_CLICKS_JOB,
        status=dg.DagsterRunStatus.FAILURE,
        run_config=config,
        tags={TAG_DC: "dc1", TAG_STREAM: stream, TAG_WORK_UNIT: unit, TAG_ATTEMPT: str(attempt)},
    )


def test_failed_work_units_are_retried_under_new_keys_with_backoff(tmp_path, instance):
    settings = PipelineSettings(retry_backoff_seconds=10, max_attempts=3)
    failed_run(instance, "dc1.click.00000007", 1)
    now = instance.get_run_records()[0].update_timestamp.timestamp()
    assert plan_retries(instance, "click", "dc1", settings, DataLayout(tmp_path), now=now + 1).waiting == ["dc1.click.00000007"]
    plan = plan_retries(instance, "click", "dc1", settings, DataLayout(tmp_path), now=now + 11)
    [retry] = plan.run_requests
    assert retry.run_key == "dc1.click.00000007#2"
    assert retry.run_config["ops"]["join_clicks"]["config"]["attempt"] == 2
    assert retry.run_config["ops"]["join_clicks"]["config"]["work_unit"] == "dc1.click.00000007"

    # Attempt 2 failed too: backoff doubles. Attempt 3 failed: exhausted, reported, not retried.
    failed_run(instance, "dc1.click.00000007", 2)
    assert plan_retries(instance, "click", "dc1", settings, DataLayout(tmp_path), now=now + 15).waiting
    failed_run(instance, "dc1.click.00000007", 3)
    plan = plan_retries(instance, "click", "dc1", settings, DataLayout(tmp_path), now=now + 10_000)
    assert plan.run_requests == [] and plan.exhausted == ["dc1.click.00000007"]


def test_a_succeeded_work_unit_is_not_retried(tmp_path, instance):
    failed_run(instance, "dc1.click.00000001", 1)
    create_run_for_test(instance, job_name=JOIN_CLICKS_JOB, status=dg.DagsterRunStatus.SUCCESS,
                        tags={TAG_DC: "dc1", TAG_STREAM: "click", TAG_WORK_UNIT: "dc1.click.00000001", TAG_ATTEMPT: "2"})
    plan = plan_retries(instance, "click", "dc1", PipelineSettings(retry_backoff_seconds=0), DataLayout(tmp_path))
    assert plan.run_requests == [] and plan.waiting == [] and plan.exhausted == []


def test_a_catch_up_run_is_retried_with_the_unit_it_cut_for_itself(tmp_path, instance):
    """Materialized with no work unit in its config, a run cut its own unit and took its tags: its
    retry names that unit, read back from the work unit log; one that died before recording its
    unit cut nothing, and is not retried."""
    layout = DataLayout(tmp_path)
    unit = WorkUnit("dc1.click.00000003.abcdef12", 3, (("w/0.jsonl", 0, 40),), run_id="abcdef12-run", clock_us=123)
    WorkUnitLog.load(layout.work_unit_log("dc1", "click")).append([unit])
    for unit_id in (unit.id, "dc1.click.00000004.deadbeef"):
        create_run_for_test(instance, job_name="__ASSET_JOB", status=dg.DagsterRunStatus.FAILURE, run_config={},
                            tags={TAG_DC: "dc1", TAG_STREAM: "click", TAG_KIND: "log_ranges", TAG_WORK_UNIT: unit_id,
                                  TAG_ATTEMPT: "1"})
    [retry] = plan_retries(instance, "click", "dc1", PipelineSettings(retry_backoff_seconds=0), layout).run_requests
    assert (retry.run_key, retry.job_name) == (f"{unit.id}#2", JOIN_CLICKS_JOB)
    assert retry.run_config["ops"]["join_clicks"]["config"] == {
        "dc": "dc1", "work_unit": unit.id, "kind": "log_ranges", "clock_us": 123, "attempt": 2,
        "ranges": [{"file": "w/0.jsonl", "start": 0, "end": 40}]}
    assert plan_retries(instance, "click", "dc1", PipelineSettings(retry_backoff_seconds=0), layout).run_requests == [retry]
    [dead] = [r for r in instance.get_runs() if r.tags[TAG_WORK_UNIT].endswith("deadbeef")]
    assert "photon/recovered" in dead.tags


def test_pending_clicks_are_retried_only_when_query_data_could_hold_their_queries(tmp_path, instance):
    layout = DataLayout(tmp_path)
    sensor = partial(pending_dispatcher, "dc1", str(tmp_path))
    assert "no pending" in evaluate(sensor, instance).skip_reason.skip_message

    # Two clicks wait: one for writer w1 to log past ts 500, one for writer w2 (no logs yet).
    progress_file = layout.query_progress_file("dc1")
    QueryProgress.merge(progress_file, {"w1": (100, 400)})
    PendingDigest(pending=2, needs={"w1": [500, 0], "w2": [700, 0]}, oldest_ts=450, stream_ts=400).save(
        layout.pending_digest_file("dc1"))
    waiting = evaluate(sensor, instance)
    assert waiting.run_requests == [] and "wait for query data" in waiting.skip_reason.skip_message

    # w1 logs on in order, but not yet up to 500 (a new file of it changes nothing): no retry.
    QueryProgress.merge(progress_file, {"w1": (401, 450)})
    QueryProgress.merge(progress_file, {"w1": (451, 499)})
    assert evaluate(sensor, instance, cursor=waiting.cursor).run_requests == []

    # A work unit brings w1 lines behind its progress (a file the dispatcher reached late): a retry.
    assert QueryProgress.merge(progress_file, {"w1": (300, 350)}).writers["w1"] == WriterProgress(499, 1)
    retry = evaluate(sensor, instance, cursor=waiting.cursor)
    [request] = retry.run_requests
    assert request.run_key == "dc1.pending.00000000" and request.tags[TAG_KIND] == PENDING_RETRY
    assert json.loads(retry.cursor) == {"retries": 1, "v": 1}

    # While that retry runs, no second one.
    create_run_for_test(instance, job_name=JOIN_CLICKS_JOB, status=dg.DagsterRunStatus.STARTED,
                        tags={TAG_DC: "dc1", TAG_KIND: PENDING_RETRY, TAG_WORK_UNIT: "dc1.pending.00000000"})
    busy = evaluate(sensor, instance, cursor=retry.cursor)
    assert busy.run_requests == [] and "is not done" in busy.skip_reason.skip_message


def test_retry_decision_honours_new_writers_backoff_and_unjoinable_age():
    waits_for_w2 = PendingDigest(pending=1, needs={"w2": [700, 0]}, oldest_ts=450, stream_ts=400)
    assert not pending_retry_decision(waits_for_w2, QueryProgress({"w2": WriterProgress(699)}), 3600).ready
    assert pending_retry_decision(waits_for_w2, QueryProgress({"w2": WriterProgress(700)}), 3600).ready
    progress = QueryProgress({"w1": WriterProgress(10_000_000)})
    backoff = PendingDigest(pending=1, retry_at=1000.0, oldest_ts=9_000_000, stream_ts=10_000_000)
    assert pending_retry_decision(backoff, progress, 3600, now=999.0).wait_until == 1000.0
    assert pending_retry_decision(backoff, progress, 3600, now=1000.0).ready
    # The query stream moves past the oldest click's unjoinable age: its final lookup is due.
    aged = PendingDigest(pending=1, oldest_ts=1_000_000, stream_ts=5_000_000)
    assert not pending_retry_decision(aged, QueryProgress({"w1": WriterProgress(5_000_000)}), 8).ready
    assert pending_retry_decision(aged, progress, 8).ready


def test_pacing_cuts_click_lines_up_to_the_query_streams_watermark_while_query_data_waits(tmp_path, instance):
    layout = DataLayout(tmp_path)
    second = 1_000_000
    click_file = layout.stream_dir("dc1", "click") / "w" / "0.jsonl"
    write_lines(click_file, [click(f"10.3.0.1:1:{t}", "10.1.0.1:7:1", t * second) for t in (50, 150, 900)])
    starts = [0]
    for line in click_file.read_bytes().splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    # Query lines not cut into work units yet: the query stream's watermark is about to advance.
    write_lines(layout.stream_dir("dc1", "query") / "w" / "0.jsonl", [query("10.1.0.1:7:1", 1)])
    sensor = partial(log_dispatcher, "dc1", "click", str(tmp_path))
    knobs = {"pacing_max_hold_seconds": 3600}

    def cut(result):
        return [(r["start"], r["end"]) for req in result.run_requests
                for r in req.run_config["ops"]["join_clicks"]["config"]["ranges"]]

    def query_pass(unit, times):
        EventTimeWatermark.add_pass(layout.watermark_file("dc1", "query"), unit, len(times), times, len(times),
                                    WatermarkRule(percentile=5, windows=4, max_passes=64))

    # A pass whose newest query is at 900 s, but 95 % of them at or after 100 s: the watermark.
    query_pass("q1", [second] + [100 * second] * 19 + [900 * second])
    first = evaluate(sensor, instance, **knobs)
    assert cut(first) == [(0, starts[1])]
    held = json.loads(first.cursor)
    assert held["held"]["w/0.jsonl"][0] == starts[1] and held["paced_ticks"] == 1
    [observation] = first.asset_events
    assert observation.metadata["clicks_ahead_of_queries_seconds"].value == 50.0

    # The query stream's watermark passes the second click.
    query_pass("q2", [850 * second] * 21)
    later = evaluate(sensor, instance, cursor=first.cursor, **knobs)
    assert cut(later) == [(starts[1], starts[2])]
    assert json.loads(later.cursor)["held"]["w/0.jsonl"][0] == starts[2]

    # Lines held at the same place for pacing_max_hold_seconds go (a bogus future timestamp must not
    # hold a file for good).
    stale = json.dumps({**json.loads(later.cursor), "held": {"w/0.jsonl": [starts[2], 1.0]}})
    released = evaluate(sensor, instance, cursor=stale, **knobs)
    assert cut(released) == [(starts[2], starts[3])] and json.loads(released.cursor)["held"] == {}

    # Once the query logs are all cut into work units (and no query run is unfinished), nothing
    # could advance the progress: click lines are not held, however far ahead.
    write_lines(click_file, [click("10.3.0.1:1:5000", "10.1.0.1:7:1", 5000 * second)])
    assert evaluate(sensor, instance, cursor=released.cursor, **knobs).run_requests == []
    evaluate(partial(log_dispatcher, "dc1", "query", str(tmp_path)), instance)
    unheld = evaluate(sensor, instance, cursor=released.cursor, **knobs)
    assert [r.run_key for r in unheld.run_requests] == ["dc1.click.00000003"]


def test_with_a_query_tailer_pacing_goes_by_its_watermark_and_holds_only_while_it_has_lines_to_read(
        tmp_path, instance):
    """A fresh query tail mirror (photon/query_tail.py) replaces the query runs' watermark and their
    waiting query data: click lines wait only for lines the tailer has not read yet."""
    layout = DataLayout(tmp_path)
    second = 1_000_000
    click_file = layout.stream_dir("dc1", "click") / "w" / "0.jsonl"
    write_lines(click_file, [click(f"10.3.0.1:1:{t}", "10.1.0.1:7:1", t * second) for t in (50, 900)])
    first_end = len(click_file.read_bytes().splitlines(keepends=True)[0])
    query_file = layout.stream_dir("dc1", "query") / "w" / "0.jsonl"
    write_lines(query_file, [query("10.1.0.1:7:1", 1)])
    EventTimeWatermark.add_pass(layout.watermark_file("dc1", "query_tail"), "tail.1", 21, [100 * second] * 21, 21,
                                WatermarkRule(percentile=5, windows=4, max_passes=64))
    sensor = partial(log_dispatcher, "dc1", "click", str(tmp_path))
    knobs = {"pacing_max_hold_seconds": 3600, "pacing_margin_seconds": 0}

    def ranges(result):
        return [(r["start"], r["end"]) for req in result.run_requests
                for r in req.run_config["ops"]["join_clicks"]["config"]["ranges"]]

    # The tailer has a query line left to read: the click at 900 s, past its watermark, waits.
    QueryTail(offsets={}, part=1, updated_at=time.time()).save(layout.query_tail_file("dc1"))
    held = evaluate(sensor, instance, **knobs)
    assert ranges(held) == [(0, first_end)]
    # It has read every line: nothing could move its watermark, nothing waits (no query run needed).
    QueryTail(offsets={"w/0.jsonl": query_file.stat().st_size}, part=2, updated_at=time.time()).save(
        layout.query_tail_file("dc1"))
    assert ranges(evaluate(sensor, instance, cursor=held.cursor, **knobs)) == [(first_end, click_file.stat().st_size)]


def test_with_a_query_tailer_the_query_dispatcher_cuts_for_the_durable_tier_at_its_own_cadence(tmp_path, instance):
    layout = DataLayout(tmp_path)
    query_file = layout.stream_dir("dc1", "query") / "w" / "0.jsonl"
    write_lines(query_file, [query("10.1.0.1:7:1", 1)])

    def tailed_to_here() -> None:  # the tailer has read every line so far
        QueryTail(offsets={"w/0.jsonl": query_file.stat().st_size}, part=1, updated_at=time.time()).save(
            layout.query_tail_file("dc1"))

    tailed_to_here()
    sensor = partial(log_dispatcher, "dc1", "query", str(tmp_path))
    first = evaluate(sensor, instance)
    assert [r.run_key for r in first.run_requests] == ["dc1.query.00000000"]
    write_lines(query_file, [query("10.1.0.1:7:2", 2)])
    tailed_to_here()
    deferred = evaluate(sensor, instance, cursor=first.cursor)
    assert deferred.run_requests == [] and json.loads(deferred.cursor)["deferred"]
    every = PipelineSettings().query_run_every_seconds
    assert f"every {every:.0f} s" in deferred.skip_reason.skip_message
    # Its cadence passed: the lines are cut, only up to where the tailer read (its segments hold their
    # parse: resources/event_store/tail_segments.py); a line it has not read waits for it.
    tailed_at = query_file.stat().st_size
    write_lines(query_file, [query("10.1.0.1:7:2b", 2)])
    due = json.dumps({**json.loads(deferred.cursor), "cut_at": time.time() - every - 1})
    [request] = evaluate(sensor, instance, cursor=due).run_requests
    assert request.run_key == "dc1.query.00000001"
    assert WorkUnitLog.load(layout.work_unit_log("dc1", "query")).next_offsets() == {"w/0.jsonl": tailed_at}
    # A stale mirror is a tailer that is not running: every new line is cut at once, as without one.
    write_lines(query_file, [query("10.1.0.1:7:3", 3)])
    QueryTail(offsets={}, part=1, updated_at=time.time() - 60).save(layout.query_tail_file("dc1"))
    cursor = evaluate(sensor, instance, cursor=due).cursor
    write_lines(query_file, [query("10.1.0.1:7:4", 4)])
    assert [r.run_key for r in evaluate(sensor, instance, cursor=cursor).run_requests] == ["dc1.query.00000003"]



def test_a_fresh_process_starts_no_durable_tier_run_beside_its_first_click_run(tmp_path, instance):
    layout = DataLayout(tmp_path)
    query_file = layout.stream_dir("dc1", "query") / "w" / "0.jsonl"
    write_lines(query_file, [query("10.1.0.1:7:1", 1)])
    QueryTail(offsets={"w/0.jsonl": query_file.stat().st_size}, part=1, updated_at=time.time()).save(
        layout.query_tail_file("dc1"))
    registry = IdRegistryResource(data_dir=instance.root_directory)
    click_tags = {TAG_DC: "dc1", TAG_STREAM: "click", TAG_KIND: "log_ranges", TAG_WORK_UNIT: "dc1.click.00000000"}

    cursor = None

    def tick(started_at: float, **settings) -> dg.SensorResult:  # ticks one after another, as one sensor's
        nonlocal cursor
        deps = SensorDeps(PipelineSettings(**settings), registry.get, started_at=started_at)
        result = log_dispatcher("dc1", "query", str(tmp_path), deps)(dg.build_sensor_context(instance=instance, cursor=cursor))
        cursor = result.cursor
        return result

    started = time.time()
    # Before any click run, within the cadence of the start: the durable tier waits (its JVM is cold).
    before = tick(started)
    assert before.run_requests == [] and "first click run has not ended" in before.skip_reason.skip_message
    assert json.loads(before.cursor)["deferred"]
    # With no click to join it waits no longer than the cadence.
    [late] = tick(started - PipelineSettings().query_run_every_seconds - 1).run_requests
    assert late.run_key == "dc1.query.00000000"
    write_lines(query_file, [query("10.1.0.1:7:2", 2)])
    QueryTail(offsets={"w/0.jsonl": query_file.stat().st_size}, part=2, updated_at=time.time()).save(
        layout.query_tail_file("dc1"))
    # Its first click run under way, however long after the start: the durable tier waits for it,
    # unless a catch-up unit's worth waits.
    run = create_run_for_test(instance, job_name=JOIN_CLICKS_JOB, status=dg.DagsterRunStatus.STARTED, tags=click_tags)
    long_ago = started - 600
    assert tick(long_ago).run_requests == [] and json.loads(cursor)["deferred"]
    assert [r.run_key for r in tick(long_ago, query_catch_up_work_unit_bytes=10).run_requests] == ["dc1.query.00000001"]
    write_lines(query_file, [query("10.1.0.1:7:3", 3)])
    QueryTail(offsets={"w/0.jsonl": query_file.stat().st_size}, part=3, updated_at=time.time()).save(
        layout.query_tail_file("dc1"))
    # It ended: the process is warm for good (the cursor says so); the lines wait for the cadence alone.
    instance.report_run_canceled(run)
    warm = tick(long_ago)
    assert warm.run_requests == [] and "is cut every" in warm.skip_reason.skip_message
    assert json.loads(cursor)["warm_since"] == long_ago
    cursor = json.dumps({**json.loads(cursor), "cut_at": 0.0})
    assert [r.run_key for r in tick(long_ago).run_requests] == ["dc1.query.00000002"]
    # A process with no start to mind (0) never waits for a click run.
    create_run_for_test(instance, job_name=JOIN_CLICKS_JOB, status=dg.DagsterRunStatus.STARTED, tags=click_tags)
    write_lines(query_file, [query("10.1.0.1:7:4", 4)])
    QueryTail(offsets={"w/0.jsonl": query_file.stat().st_size}, part=4, updated_at=time.time()).save(
        layout.query_tail_file("dc1"))
    cursor = json.dumps({**json.loads(cursor), "cut_at": 0.0})
    assert [r.run_key for r in tick(0.0).run_requests] == ["dc1.query.00000003"]

@pytest.fixture
def registry(tmp_path):
    yield IdRegistryResource(data_dir=str(tmp_path))
    close_embedded_registries()


def test_two_datacenters_cut_their_own_shares_and_skip_what_the_other_finished(tmp_path, instance, registry):
    """Active-active (resources/registry/ownership.py) through the registry: each datacenter's dispatcher cuts
    the files preferred for it, a finished range is skipped without a run, and the share of a
    datacenter whose lease lapsed is taken over where it stopped."""
    files = [f"w{i}/00000.jsonl" for i in range(8)]
    for dc in ("dc1", "dc2"):
        for n, file in enumerate(files):
            write_lines(tmp_path / "logs" / dc / "click" / file, [click(f"10.0.0.1:{n}:{i}", "q", i) for i in range(5)])
    registry.get().heartbeat("dc1", 60)
    registry.get().heartbeat("dc2", 60)
    owner = {f: preferred_dc(f, {"dc1", "dc2"}) for f in files}
    assert set(owner.values()) == {"dc1", "dc2"}
    settings = {"pacing_max_hold_seconds": 0, "click_catch_up_work_unit_bytes": 0}

    def cut(result) -> dict[str, tuple[int, int]]:
        return {r["file"]: (r["start"], r["end"]) for q in result.run_requests
                for r in q.run_config["ops"]["join_clicks"]["config"]["ranges"]}

    dc1, dc2 = partial(log_dispatcher, "dc1", "click", str(tmp_path)), partial(log_dispatcher, "dc2", "click", str(tmp_path))
    first1 = evaluate(dc1, instance, registry=registry, **settings)
    first2 = evaluate(dc2, instance, registry=registry, **settings)
    assert set(cut(first1)) == {f for f in files if owner[f] == "dc1"}
    assert set(cut(first2)) == {f for f in files if owner[f] == "dc2"}
    assert set(json.loads(first2.cursor)["waiting"]) == {f for f in files if owner[f] == "dc1"}
    assert first2.skip_reason is None

    # dc1 finishes its units, then stops (its lease released); a dc1 file grows in both replicas.
    for request in first1.run_requests:
        assert registry.get().finish_work(request.run_key, pending=False) >= 1
    registry.get().heartbeat("dc1", 0)
    grown = next(f for f in files if owner[f] == "dc1")
    size = (tmp_path / "logs" / "dc1" / "click" / grown).stat().st_size
    for dc in ("dc1", "dc2"):
        write_lines(tmp_path / "logs" / dc / "click" / grown, [click("10.0.0.1:99:1", "q", 99)])
    later = evaluate(dc2, instance, cursor=first2.cursor, registry=registry, **settings)
    # dc2 reads only the new line: the bytes dc1 joined are recorded as skipped, with no run.
    assert cut(later) == {grown: (size, (tmp_path / "logs" / "dc2" / "click" / grown).stat().st_size)}
    log = WorkUnitLog.load(tmp_path / "state" / "dispatcher" / "dc2" / "click.jsonl")
    [skipped] = [u for u in log.units if u.skipped]
    assert {f for f, _, _ in skipped.ranges} == {f for f in files if owner[f] == "dc1"}
    assert skipped.id not in [r.run_key for r in later.run_requests]
    assert json.loads(later.cursor)["waiting"] == {}


def test_a_datacenter_back_from_an_outage_skips_what_the_other_joined_without_waiting_for_its_query_logs(
        tmp_path, instance, registry):
    """Pacing holds only the lines a datacenter joins itself: the ranges the other one finished while
    it was down need no query, and are skipped at once while its query tailer still reads the outage's
    query logs; its own new lines wait for the tailer's watermark, and nothing past them is recorded."""
    second = 1_000_000
    file = "w0/00000.jsonl"
    for dc in ("dc1", "dc2"):
        write_lines(tmp_path / "logs" / dc / "click" / file,
                    [click(f"10.3.0.1:1:{t}", "10.1.0.1:7:1", t * second) for t in (100, 200, 300)])
    outage_end = (tmp_path / "logs" / "dc2" / "click" / file).stat().st_size
    # dc1 joined every line written while dc2 was down (its claim is done), then both are live.
    registry.get().heartbeat("dc1", 60)
    registry.get().claim_work("dc1", "click", [{"unit": "dc1.click.00000000", "ranges": [[file, 0, outage_end]]}])
    assert registry.get().finish_work("dc1.click.00000000", pending=False) >= 1
    registry.get().heartbeat("dc2", 60)
    for dc in ("dc1", "dc2"):  # dc2's own new lines, past its query tailer's watermark (250 s)
        write_lines(tmp_path / "logs" / dc / "click" / file, [click("10.3.0.1:1:900", "10.1.0.1:7:1", 900 * second)])
    layout = DataLayout(tmp_path)
    query_file = layout.stream_dir("dc2", "query") / "w" / "0.jsonl"
    write_lines(query_file, [query("10.1.0.1:7:1", 1)])  # a query line its tailer has not read yet
    EventTimeWatermark.add_pass(layout.watermark_file("dc2", "query_tail"), "tail.1", 21, [250 * second] * 21, 21,
                                WatermarkRule(percentile=5, windows=4, max_passes=64))
    QueryTail(offsets={}, part=1, updated_at=time.time()).save(layout.query_tail_file("dc2"))
    # No grace: were the file dc1's preferred one, dc2 would not wait for it either.
    settings = {"pacing_max_hold_seconds": 3600, "pacing_margin_seconds": 0, "takeover_grace_seconds": 0}
    result = evaluate(partial(log_dispatcher, "dc2", "click", str(tmp_path)), instance, registry=registry, **settings)
    log = WorkUnitLog.load(layout.work_unit_log("dc2", "click"))
    assert [(u.skipped, u.ranges) for u in log.units] == [(True, ((file, 0, outage_end),))]
    assert result.run_requests == []
    assert json.loads(result.cursor)["held"][file][0] == outage_end
