"""What `photon run`'s drain counts as work still to come (photon/runner.py: dispatchers_waiting)."""

import dagster as dg

from photon.runner import dispatchers_waiting
from photon_assets.work_unit import TAG_WORK_UNIT
from resources.state.layout import DataLayout
from resources.state.work_unit_log import WorkUnit, WorkUnitLog


def test_a_query_work_unit_cut_whose_run_is_not_created_yet_is_work_to_come(tmp_path):
    """The query dispatcher records a unit before the run its tick requested is created; a drain that
    saw neither uncut lines nor a run in flight there ended with the clicks that wait for it pending."""
    layout = DataLayout(tmp_path / "data")
    stream = layout.stream_dir("dc1", "query")
    stream.mkdir(parents=True)
    (stream / "q.jsonl").write_bytes(b'{"a": 1}\n')
    WorkUnitLog(layout.work_unit_log("dc1", "query")).append([
        WorkUnit("dc1.query.00000000", 0, (("q.jsonl", 0, 5),), skipped=True),  # another datacenter's: no run
        WorkUnit("dc1.query.00000001", 1, (("q.jsonl", 5, 9),)),
    ])
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        assert dispatchers_waiting(instance, [], layout, ["dc1"]) == [
            "dc1: query work unit dc1.query.00000001 cut, its run not created yet"]
        run = instance.create_run_for_job(dg.GraphDefinition("ingest_queries").to_job(),
                                          tags={TAG_WORK_UNIT: "dc1.query.00000001"})
        instance.report_run_canceled(run)  # a run exists (its retry counts as in flight, not as cut and unrun)
        waiting = dispatchers_waiting(instance, [], layout, ["dc1"])
        assert not any("cut, its run not created yet" in w for w in waiting), waiting
