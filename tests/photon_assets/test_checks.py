"""The checks a click run makes of what it wrote (photon_assets/checks.py: work_unit_checks), on rows
as unit_rows reads them and answers as the registry gives them."""

import pyarrow as pa

from photon_assets.checks import WORK_UNIT_ACCOUNTED_FOR, WORK_UNIT_JOINED_ONCE, work_unit_checks
from spark_ops.join import JoinStats


def ids(*click_ids: str) -> pa.Table:
    return pa.table({"click_id": pa.array(click_ids, pa.string())})


def registered(*click_ids: str, status: str = "registered") -> pa.Table:
    return pa.table({"click_id": pa.array(click_ids, pa.string()), "token": pa.array([None] * len(click_ids), pa.string()),
                     "status": pa.array([status] * len(click_ids), pa.string())})


def results(joined, unjoinable, answers, **counts) -> dict:
    checked = work_unit_checks(joined, unjoinable, answers, JoinStats(**counts))
    return {r.check_name: (r.passed, {k: v.value for k, v in r.metadata.items()}) for r in checked}


def test_a_unit_whose_every_click_is_written_once_and_registered_passes():
    checked = results(ids("a", "b"), ids("c"), registered("a", "b"), looked_up=6, pending=1, skipped_registered=1,
                      refused=1)
    assert checked[WORK_UNIT_JOINED_ONCE] == (True, {"joined_rows": 2, "duplicate_rows": 0, "also_unjoinable": 0,
                                                     "not_registered": 0})
    assert checked[WORK_UNIT_ACCOUNTED_FOR] == (True, {"clicks_looked_up": 6, "joined_rows": 2, "unjoinable_rows": 1,
                                                       "pending": 1, "registered_elsewhere": 2, "unaccounted": 0})


def test_a_click_written_twice_or_also_unjoinable_or_unregistered_fails():
    passed, counts = results(ids("a", "a", "b", "c"), ids("b"), registered("a", "b"), looked_up=3)[WORK_UNIT_JOINED_ONCE]
    assert not passed
    assert (counts["duplicate_rows"], counts["also_unjoinable"], counts["not_registered"]) == (1, 1, 1)
    # Older than the registry's GC boundary is not registered either.
    passed, counts = results(ids("a"), ids(), registered("a", status="too_old"), looked_up=1)[WORK_UNIT_JOINED_ONCE]
    assert not passed and counts["not_registered"] == 1


def test_a_click_looked_up_but_neither_written_pending_nor_registered_elsewhere_fails():
    passed, counts = results(ids("a"), ids(), registered("a"), looked_up=3, pending=1)[WORK_UNIT_ACCOUNTED_FOR]
    assert not passed and counts["unaccounted"] == 1
