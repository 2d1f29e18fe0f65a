"""Assets and checks through Dagster's `materialize`, on real Spark, Delta and DuckDB."""

import json

import dagster as dg
import deltalake
import pytest

from photon_assets.checks import ALL_CHECKS, aggregates_match_joined_clicks, failed_blocking_checks
from photon_assets.clicks import click_aggregates, join_clicks
from photon_assets.jobs import CLICK_RUN_SELECTION
from photon_assets.maintenance import maintain_tables_job
from photon_assets.queries import ingest_query_logs
from photon_assets.recovery import recover_lost_clicks_job
from photon_assets.work_unit import PENDING_RETRY, TAG_DC, TAG_STREAM, TAG_WORK_UNIT, bytes_behind_log_heads
from resources.id_registry import IdRegistryResource, close_embedded_registries
from resources.settings import PipelineSettings
from resources.spark.session import SparkResource
from resources.state.layout import DataLayout
from resources.state.work_unit_log import WorkUnit, WorkUnitLog
from resources.storage import WarehouseResource
from sensors.deps import SensorDeps
from sensors.dispatcher import log_dispatcher
from tests.conftest import click, query, write_lines

ASSETS = [ingest_query_logs, join_clicks, click_aggregates, *ALL_CHECKS]
CLICK_UNIT = CLICK_RUN_SELECTION
QUERY_UNIT = dg.AssetSelection.assets("query_logs", "log_file_map").without_checks()
AGGREGATES = dg.AssetSelection.assets("click_aggregates").without_checks()


@pytest.fixture
def data_dir(tmp_path):
    yield tmp_path
    close_embedded_registries()


def resources(data_dir):
    return {
        "spark": SparkResource.local(shuffle_partitions=2, driver_memory="2g"),
        "warehouse": WarehouseResource(data_dir=str(data_dir)),
        "registry": IdRegistryResource(data_dir=str(data_dir)),
        "settings": PipelineSettings(pending_backoff_seconds=0),
    }


def unit(op: str, work_unit: str, path=None, kind="log_ranges") -> dict:
    ranges = [] if path is None else [{"file": "w/0.jsonl", "start": 0, "end": path.stat().st_size}]
    config = {"dc": "dc1", "work_unit": work_unit, "kind": kind, "ranges": ranges}
    return {"ops": {op: {"config": config}}}


def materialize(data_dir, instance, selection, run_config=None, raise_on_error=True):
    return dg.materialize(ASSETS, selection=selection, resources=resources(data_dir), instance=instance,
                          run_config=run_config or {}, raise_on_error=raise_on_error)


def metadata(result, asset: str) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_pipeline_through_assets_and_checks(data_dir):
    logs = data_dir / "logs" / "dc1"
    clicks = write_lines(logs / "click" / "w" / "0.jsonl",
                        [click("10.3.0.1:1:1", "10.1.0.1:1:1", 10), click("10.3.0.1:1:2", "10.1.0.1:1:2", 20),
                         "not json at all"])
    with dg.instance_for_test() as instance:
        # Clicks first: their queries are not there yet, so they stay pending.
        joined = materialize(data_dir, instance, CLICK_UNIT, unit("join_clicks", "dc1.click.00000000", clicks))
        assert joined.success
        assert metadata(joined, "joined_clicks")["clicks_pending"] == 2
        assert metadata(joined, "click_ledger")["quarantined_lines"] == 1
        # Pending clicks and quarantined lines, external assets, get a materialization per change.
        for asset, rows in (("pending_clicks", 2), ("quarantined_lines", 1)):
            [event] = instance.fetch_materializations(dg.AssetKey(asset), limit=1).records
            assert event.asset_materialization.metadata["dagster/row_count"].value == rows, asset
        assert metadata(joined, "joined_clicks")["dagster/uri"] == (data_dir / "warehouse" / "joined_clicks").resolve().as_uri()
        # What the pass cost: Spark jobs, Delta commits (ledger, quarantine, pending) and phases.
        cost = metadata(joined, "joined_clicks")
        assert cost["spark_jobs"] > 0 and cost["phase_parse_seconds"] > 0
        assert (cost["delta_commits_click_ledger"], cost["delta_commits_quarantined_lines"],
                cost["delta_commits_pending_clicks"]) == (1, 1, 1)

        queries = write_lines(logs / "query" / "w" / "0.jsonl", [query("10.1.0.1:1:1", 5), query("10.1.0.1:1:2", 6)])
        ingested = materialize(data_dir, instance, QUERY_UNIT, unit("ingest_query_logs", "dc1.query.00000000", queries))
        assert metadata(ingested, "query_logs")["queries_added"] == 2
        assert metadata(ingested, "query_logs")["memory_tier_queries"] == 2
        assert metadata(ingested, "query_logs")["dagster/row_count"] == 2
        assert metadata(ingested, "log_file_map")["entries_added"] >= 1
        assert metadata(ingested, "query_logs")["delta_commits"] == 2  # query_logs, log_file_map

        retried = materialize(data_dir, instance, CLICK_UNIT, unit("join_clicks", "dc1.pending.00000000", kind=PENDING_RETRY))
        assert metadata(retried, "joined_clicks")["clicks_joined"] == 2
        assert metadata(retried, "joined_clicks")["dagster/row_count"] == 2
        # Found in memory: the registry's memory tier holds the query run's lines.
        assert metadata(retried, "joined_clicks")["eventstore_memory_hit_ratio"] == 1.0
        # The aggregates, refreshed by a run of their own (no run config needed).
        refreshed = metadata(materialize(data_dir, instance, AGGREGATES), "click_aggregates")
        assert (refreshed["dagster/row_count"], refreshed["refreshed"]) == (1, "all")

        checked = materialize(data_dir, instance, dg.AssetSelection.checks(*ALL_CHECKS))
        evaluations = {e.check_name: e for e in checked.get_asset_check_evaluations()}
        assert all(e.passed for e in evaluations.values()), evaluations
        counts = {k: v.value for k, v in evaluations["clicks_accounted_for"].metadata.items()}
        assert counts["distinct_clicks"] == 2 and counts["joined"] == 2 and counts["pending"] == 0
        capped = {k: v.value for k, v in evaluations["joined_clicks_within_query_cap"].metadata.items()}
        assert capped == {"max_clicks_per_query": 0, "largest_query_joined_clicks": 1, "queries_over_cap": 0,
                          "clicks_capped": 0}



def test_materialize_with_no_config_catches_up_on_every_line_not_yet_in_a_work_unit(data_dir):
    """Materialize in the UI: each run cuts a catch-up unit of what no work unit holds yet, under
    the dispatcher's lock and rules, records itself as the unit's run and takes its tags; the
    dispatcher then requests no run for those bytes. With nothing new, the tables as they are."""
    logs = data_dir / "logs" / "dc1"
    write_lines(logs / "query" / "w" / "0.jsonl", [query("10.1.0.1:1:1", 5), query("10.1.0.1:1:2", 6)])
    click_file = write_lines(logs / "click" / "w" / "0.jsonl", [click("10.3.0.1:1:1", "10.1.0.1:1:1", 10)])
    layout = DataLayout(data_dir)
    with dg.instance_for_test() as instance:
        # A dispatcher already cut the first click line; the catch-up takes what follows.
        WorkUnitLog.load(layout.work_unit_log("dc1", "click")).append(
            [WorkUnit("dc1.click.00000000", 0, (("w/0.jsonl", 0, click_file.stat().st_size),))])
        first_end = click_file.stat().st_size
        write_lines(click_file, [click("10.3.0.1:1:2", "10.1.0.1:1:2", 20)])
        ingested = materialize(data_dir, instance, QUERY_UNIT)
        assert metadata(ingested, "query_logs")["queries_added"] == 2
        joined = materialize(data_dir, instance, CLICK_UNIT)
        done = metadata(joined, "joined_clicks")
        assert (done["clicks_joined"], done["dagster/row_count"]) == (1, 1)
        # What the UI plots: latency to the output commit, the registry's batching, the logs not cut yet.
        assert done["latency_p90_seconds"] >= done["latency_p50_seconds"] > 0
        assert done["registry_ids_per_transaction"] > 0
        assert metadata(joined, "click_ledger")["bytes_behind_log_heads"] == 0
        [query_unit] = WorkUnitLog.load(layout.work_unit_log("dc1", "query")).units
        catch_up = WorkUnitLog.load(layout.work_unit_log("dc1", "click")).units[-1]
        assert catch_up.ranges == (("w/0.jsonl", first_end, click_file.stat().st_size),)
        assert (catch_up.run_id, done["work_unit"]) == (joined.run_id, catch_up.id)
        assert query_unit.run_id == ingested.run_id and query_unit.clock_us > 0
        tags = instance.get_run_by_id(joined.run_id).tags
        assert (tags[TAG_WORK_UNIT], tags[TAG_DC], tags[TAG_STREAM]) == (catch_up.id, "dc1", "click")

        # The dispatchers find nothing to cut and nothing to request.
        for stream in ("query", "click"):
            sensor = log_dispatcher("dc1", stream, str(data_dir), SensorDeps(PipelineSettings(), resources(data_dir)["registry"].get))
            context = dg.build_sensor_context(instance=instance, cursor=json.dumps({"v": 1, "requested": 0 if stream == "query" else 1}))
            assert sensor(context).run_requests == [], stream

        # Nothing new: the tables as they are, with no unit cut.
        again = materialize(data_dir, instance, CLICK_UNIT)
        assert metadata(again, "joined_clicks")["dagster/row_count"] == 1
        assert WorkUnitLog.load(layout.work_unit_log("dc1", "click")).units[-1] == catch_up
        line = write_lines(logs / "query" / "w" / "1.jsonl", [query("10.1.0.1:1:3", 7)]).stat().st_size
        assert bytes_behind_log_heads(layout, "dc1", "query") == line


def test_a_click_run_also_retries_the_pending_clicks_its_queries_arrived_for(data_dir):
    logs = data_dir / "logs" / "dc1"
    click_file = logs / "click" / "w" / "0.jsonl"
    write_lines(click_file, [click("10.3.0.1:1:1", "10.1.0.1:1:1", 10), click("10.3.0.1:1:2", "10.1.0.1:1:9", 20)])
    first_end = click_file.stat().st_size
    click_units = CLICK_UNIT
    with dg.instance_for_test() as instance:
        joined = materialize(data_dir, instance, click_units, unit("join_clicks", "dc1.click.00000000", click_file))
        assert metadata(joined, "joined_clicks")["clicks_pending"] == 2

        # The first click's query arrives; the second's (10.1.0.1:1:9) never does.
        queries = write_lines(logs / "query" / "w" / "0.jsonl", [query("10.1.0.1:1:1", 5), query("10.1.0.1:1:3", 7)])
        assert materialize(data_dir, instance, QUERY_UNIT, unit("ingest_query_logs", "dc1.query.00000000", queries)).success
        write_lines(click_file, [click("10.3.0.1:1:3", "10.1.0.1:1:3", 30)])
        config = unit("join_clicks", "dc1.click.00000001", click_file)
        config["ops"]["join_clicks"]["config"]["ranges"][0]["start"] = first_end
        second = metadata(materialize(data_dir, instance, click_units, config), "joined_clicks")
        # The new click and the pending one its query arrived for; the other is not due (its writer
        # has not logged up to its query) and stays pending without a lookup.
        assert (second["clicks_looked_up"], second["clicks_joined"], second["clicks_pending"]) == (2, 2, 0)
        assert second["pending_clicks_in_dc"] == 1 and second["dagster/row_count"] == 2


def test_a_retry_after_an_outage_reads_only_what_the_other_datacenter_did_not_finish(data_dir, monkeypatch):
    """dc1's click unit registers its clicks and dies before its output; dc2 takes the first half of
    its range over meanwhile (finding those clicks registered by dc1's token, it finishes the range
    with nothing to write). dc1's retry parses only the second half and looks up the first half's
    clicks in its ledger: every click is written once, by the retry."""
    logs = data_dir / "logs" / "dc1"
    queries = write_lines(logs / "query" / "w" / "0.jsonl", [query(f"10.1.0.1:1:{i}", i) for i in range(1, 5)])
    click_file = logs / "click" / "w" / "0.jsonl"
    write_lines(click_file, [click(f"10.3.0.1:1:{i}", f"10.1.0.1:1:{i}", 10 + i) for i in (1, 2)])
    half = click_file.stat().st_size
    write_lines(click_file, [click(f"10.3.0.1:1:{i}", f"10.1.0.1:1:{i}", 10 + i) for i in (3, 4)])
    size = click_file.stat().st_size
    config = unit("join_clicks", "dc1.click.00000000", click_file)
    with dg.instance_for_test() as instance:
        assert materialize(data_dir, instance, QUERY_UNIT, unit("ingest_query_logs", "dc1.query.00000000", queries)).success
        monkeypatch.setenv("PHOTON_FAULT", "after_registry_commit:raise")
        assert not materialize(data_dir, instance, CLICK_UNIT, config, raise_on_error=False).success
        monkeypatch.delenv("PHOTON_FAULT")
        registry = IdRegistryResource(data_dir=str(data_dir)).get()
        assert registry.lookup(deltalake.DeltaTable(str(data_dir / "warehouse" / "click_ledger")).to_pyarrow_table(
            columns=["click_id", "timestamp_us"]))["token"].to_pylist() == ["dc1.click.00000000"] * 4
        registry.claim_work("dc2", "click", [{"unit": "dc2.click.00000007", "ranges": [["w/0.jsonl", 0, half]]}])
        registry.finish_work("dc2.click.00000007", pending=False)

        config["ops"]["join_clicks"]["config"]["attempt"] = 2
        retried = materialize(data_dir, instance, CLICK_UNIT, config)
        ledger, joined = metadata(retried, "click_ledger"), metadata(retried, "joined_clicks")
        assert (ledger["bytes_finished_elsewhere"], ledger["bytes_read"], ledger["click_lines"]) == (half, size - half, 2)
        assert (joined["clicks_looked_up"], joined["clicks_joined"], joined["dagster/row_count"]) == (4, 4, 4)
        assert all(e.passed for e in retried.get_asset_check_evaluations())
        ids = deltalake.DeltaTable(str(data_dir / "warehouse" / "joined_clicks")).to_pyarrow_table(columns=["click_id"])
        assert sorted(ids["click_id"].to_pylist()) == [f"10.3.0.1:1:{i}" for i in range(1, 5)]
        # The ledger keeps the first attempt's rows, once.
        assert metadata(retried, "click_ledger")["dagster/row_count"] == 4

        # A unit whose whole range dc2 finished, retried after its output was written: nothing parsed,
        # nothing recorded again, nothing written twice.
        start = click_file.stat().st_size
        write_lines(click_file, [click(f"10.3.0.1:1:{i}", f"10.1.0.1:1:{i % 4 + 1}", 20 + i) for i in (5, 6)])
        second = unit("join_clicks", "dc1.click.00000001", click_file)
        second["ops"]["join_clicks"]["config"]["ranges"][0]["start"] = start
        monkeypatch.setenv("PHOTON_FAULT", "after_output_write:raise")
        assert not materialize(data_dir, instance, CLICK_UNIT, second, raise_on_error=False).success
        monkeypatch.delenv("PHOTON_FAULT")
        registry.claim_work("dc2", "click", [{"unit": "dc2.click.00000008", "ranges": [["w/0.jsonl", start, click_file.stat().st_size]]}])
        registry.finish_work("dc2.click.00000008", pending=False)
        second["ops"]["join_clicks"]["config"]["attempt"] = 2
        again = materialize(data_dir, instance, CLICK_UNIT, second)
        ledger, joined = metadata(again, "click_ledger"), metadata(again, "joined_clicks")
        assert (ledger["click_lines"], ledger["bytes_read"], ledger["dagster/row_count"]) == (0, 0, 6)
        assert ledger["bytes_finished_elsewhere"] == click_file.stat().st_size - start
        assert (joined["clicks_looked_up"], joined["clicks_joined"], joined["dagster/row_count"]) == (2, 2, 6)
        assert joined.get("delta_commits_click_ledger", 0) == 0
        assert all(e.passed for e in again.get_asset_check_evaluations())


def test_the_aggregates_check_compares_with_the_version_the_last_refresh_names(data_dir):
    """click_aggregates is refreshed off the click path: a refresh that has not run yet is a lag the
    check reports, not a failure; a value that is not the aggregation of joined_clicks fails it."""
    logs = data_dir / "logs" / "dc1"
    queries = write_lines(logs / "query" / "w" / "0.jsonl", [query("10.1.0.1:1:1", 5), query("10.1.0.1:1:2", 6)])
    click_file = logs / "click" / "w" / "0.jsonl"
    write_lines(click_file, [click("10.3.0.1:1:1", "10.1.0.1:1:1", 10)])
    first_end = click_file.stat().st_size
    write_lines(click_file, [click("10.3.0.1:1:2", "10.1.0.1:1:2", 20, advertiser="adv2")])

    def aggregates_check() -> dict:
        checked = materialize(data_dir, instance, dg.AssetSelection.checks(aggregates_match_joined_clicks))
        [evaluation] = checked.get_asset_check_evaluations()
        return {"passed": evaluation.passed, **{k: v.value for k, v in evaluation.metadata.items()}}

    with dg.instance_for_test() as instance:
        assert materialize(data_dir, instance, QUERY_UNIT, unit("ingest_query_logs", "dc1.query.00000000", queries)).success
        first = unit("join_clicks", "dc1.click.00000000", click_file)
        first["ops"]["join_clicks"]["config"]["ranges"][0]["end"] = first_end
        assert materialize(data_dir, instance, CLICK_UNIT, first).success
        assert materialize(data_dir, instance, AGGREGATES).success
        # The second unit's click is joined, the aggregates not refreshed yet: a lag.
        second = unit("join_clicks", "dc1.click.00000001", click_file)
        second["ops"]["join_clicks"]["config"]["ranges"][0]["start"] = first_end
        assert materialize(data_dir, instance, CLICK_UNIT, second).success
        lagging = aggregates_check()
        assert (lagging["passed"], lagging["mismatched_keys"], lagging["dagster/row_count"]) == (True, 0, 1)
        assert lagging["joined_clicks_versions_behind"] >= 1
        refreshed = metadata(materialize(data_dir, instance, AGGREGATES), "click_aggregates")
        assert refreshed["refreshed"] == "changes"
        current = aggregates_check()
        assert (current["passed"], current["joined_clicks_versions_behind"], current["dagster/row_count"]) == (True, 0, 2)

        # Another writer adds a row: the aggregates are no longer joined_clicks' aggregation.
        spark = SparkResource.local(shuffle_partitions=2, driver_memory="2g").session()
        spark.sql(f"INSERT INTO delta.`{data_dir / 'warehouse' / 'click_aggregates'}` VALUES ('adv9', current_timestamp(), 1, 1)")
        wrong = aggregates_check()
        assert (wrong["passed"], wrong["mismatched_keys"]) == (False, 1)


def test_table_maintenance_evicts_the_durable_tier_and_deletes_unreferenced_files(data_dir):
    """One table compacted a run, the one with the most files, never the durable tier (its eviction
    rewrites it); the files evicted or compacted away are deleted."""
    second = 1_000_000
    t0 = 1_700_000_000 * second
    settings = PipelineSettings(query_cache_retention_seconds=60, query_cache_vacuum_retain_hours=0,
                                maintenance_compact_at_files=2, maintenance_compact_tables_per_run=1)
    batches = [[0, 10, 20, 30], [40], [100]]  # seconds after t0
    with dg.instance_for_test() as instance:
        for i, batch in enumerate(batches):
            path = write_lines(data_dir / "logs" / "dc1" / "query" / "w" / f"{i}.jsonl",
                               [query(f"10.1.0.1:1:{t0 + s * second}", t0 + s * second) for s in batch])
            config = {"dc": "dc1", "work_unit": f"dc1.query.{i:08d}", "kind": "log_ranges",
                      "ranges": [{"file": f"w/{i}.jsonl", "start": 0, "end": path.stat().st_size}]}
            assert dg.materialize(ASSETS, selection=QUERY_UNIT, resources={**resources(data_dir), "settings": settings},
                                  instance=instance, run_config={"ops": {"ingest_query_logs": {"config": config}}}).success
        def maintain() -> dict:
            return maintain_tables_job.execute_in_process(resources={**resources(data_dir), "settings": settings},
                                                          instance=instance).output_for_node("maintain")

        first = maintain()
        # The boundary (t0 + 40 s) passed the four queries before it, the whole first file; the
        # durable tier keeps two files, the log file map has three: it is compacted.
        assert (first["queries_evicted"], first["compacted"]) == ({"dc1": 4}, ["log_file_map"])
        assert first["vacuumed"] == ["log_file_map", "query_logs"]  # retained for 0 hours: at once
        second_run = maintain()
        assert (second_run["queries_evicted"], second_run["compacted"], second_run["vacuumed"]) == ({"dc1": 0}, [], [])
    spark = SparkResource.local(shuffle_partitions=2, driver_memory="2g").session()
    for table, files in (("query_logs", 2), ("log_file_map", 1)):
        path = data_dir / "warehouse" / table
        live = {p.split("/")[-1] for p in spark.read.format("delta").load(str(path)).inputFiles()}
        assert len(live) == files
        on_disk = {p.name for p in path.rglob("*.parquet") if "_delta_log" not in p.parts}
        assert on_disk == live  # the evicted and compacted files are gone


def test_checks_fail_and_report_counts_when_an_id_is_lost(data_dir):
    """A click registered but never written (a joiner crash with no retry) fails two checks, both
    blocking: the run fails, and the aggregates are held until a later evaluation passes."""
    import pyarrow as pa

    logs = data_dir / "logs" / "dc1"
    clicks = write_lines(logs / "click" / "w" / "0.jsonl", [click("10.3.0.1:1:1", "10.1.0.1:1:1", 10)])
    with dg.instance_for_test() as instance:
        materialize(data_dir, instance, CLICK_UNIT, unit("join_clicks", "dc1.click.00000000", clicks))
        registry = IdRegistryResource(data_dir=str(data_dir)).get()
        registry.commit(pa.table({"click_id": ["10.3.0.1:1:1"], "timestamp_us": [10]}), "crashed-unit")
        assert failed_blocking_checks(instance) == []
        checked = materialize(data_dir, instance, dg.AssetSelection.checks(*ALL_CHECKS), raise_on_error=False)
        assert not checked.success
        assert sorted(failed_blocking_checks(instance)) == ["clicks_accounted_for", "registry_matches_output"]
        evaluations = {e.check_name: e for e in checked.get_asset_check_evaluations()}
        assert not evaluations["registry_matches_output"].passed
        assert evaluations["registry_matches_output"].metadata["lost_ids"].value == 1
        assert evaluations["registry_matches_output"].metadata["lost_click_ids_sample"].value == ["10.3.0.1:1:1"]
        assert not evaluations["clicks_accounted_for"].passed
        assert evaluations["clicks_accounted_for"].metadata["registered_without_output"].value == 1
        assert evaluations["joined_clicks_unique"].passed

        # The recovery job re-injects the click as pending (from the ledger) and unregisters it.
        recovered = recover_lost_clicks_job.execute_in_process(resources=resources(data_dir), instance=instance)
        outcome = recovered.output_for_node("recover_clicks")
        assert (outcome["lost_ids"], outcome["reinjected"], outcome["unregistered"]) == (1, 1, 1)
        assert registry.lookup(pa.table({"click_id": ["10.3.0.1:1:1"], "timestamp_us": [10]})).num_rows == 0
        checked = materialize(data_dir, instance, dg.AssetSelection.checks(*ALL_CHECKS))
        assert all(e.passed for e in checked.get_asset_check_evaluations())
        assert failed_blocking_checks(instance) == []


def test_a_click_written_twice_by_another_writer_fails_uniqueness_until_recovery_removes_it(data_dir):
    """Another writer appends a copy of a joined row: the uniqueness check fails (blocking: the run fails,
    the aggregates are held); recovery keeps the earliest row and recomputes the aggregates; the checks pass."""
    logs = data_dir / "logs" / "dc1"
    queries = write_lines(logs / "query" / "w" / "0.jsonl", [query("10.1.0.1:1:1", 5), query("10.1.0.1:1:2", 6)])
    clicks = write_lines(logs / "click" / "w" / "0.jsonl",
                         [click("10.3.0.1:1:1", "10.1.0.1:1:1", 10), click("10.3.0.1:1:2", "10.1.0.1:1:2", 20)])
    with dg.instance_for_test() as instance:
        materialize(data_dir, instance, QUERY_UNIT, unit("ingest_query_logs", "dc1.query.00000000", queries))
        joined = materialize(data_dir, instance, CLICK_UNIT, unit("join_clicks", "dc1.click.00000000", clicks))
        assert metadata(joined, "joined_clicks")["clicks_joined"] == 2
        materialize(data_dir, instance, AGGREGATES)
        path = str(data_dir / "warehouse" / "joined_clicks")
        row = deltalake.DeltaTable(path).to_pyarrow_table().slice(0, 1)
        deltalake.write_deltalake(path, row, mode="append")

        checked = materialize(data_dir, instance, dg.AssetSelection.checks(*ALL_CHECKS), raise_on_error=False)
        assert not checked.success
        evaluations = {e.check_name: e for e in checked.get_asset_check_evaluations()}
        assert evaluations["joined_clicks_unique"].metadata["duplicate_rows"].value == 1
        assert failed_blocking_checks(instance) == ["joined_clicks_unique"]

        recovered = recover_lost_clicks_job.execute_in_process(resources=resources(data_dir), instance=instance)
        assert recovered.output_for_node("recover_clicks")["duplicate_rows_removed"] == {
            "joined_clicks": 1, "unjoinable_clicks": 0}
        assert deltalake.DeltaTable(path).to_pyarrow_table().num_rows == 2
        checked = materialize(data_dir, instance, dg.AssetSelection.checks(*ALL_CHECKS))
        assert all(e.passed for e in checked.get_asset_check_evaluations())
        assert failed_blocking_checks(instance) == []
