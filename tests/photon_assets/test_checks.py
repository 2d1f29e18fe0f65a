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


def results(rows, unjoinable_rows, answers, first_attempt=True, **counts) -> dict:
    checked = work_unit_checks(rows, unjoinable_rows, answers, JoinStats(**counts), first_attempt)
    return {r.check_name: (r.passed, {k: v.value for k, v in r.metadata.items()}) for r in checked}


def test_a_unit_whose_every_click_is_written_once_and_registered_passes():
    checked = results(ids("a", "b"), ids("c"), registered("a", "b"), looked_up=6, joined=2, given_up=1, pending=1,
                      skipped_registered=1, refused=1)
    assert checked[WORK_UNIT_JOINED_ONCE] == (True, {"joined_rows": 2, "duplicate_rows": 0, "also_unjoinable": 0,
                                                     "not_registered": 0})
    assert checked[WORK_UNIT_ACCOUNTED_FOR] == (True, {
        "clicks_looked_up": 6, "joined": 2, "unjoinable": 1, "pending": 1, "registered_elsewhere": 2, "unaccounted": 0,
        "joined_rows": 2, "unjoinable_rows": 1, "rows_not_as_counted": 0})


def test_a_click_written_twice_or_also_unjoinable_or_unregistered_fails():
    passed, counts = results(ids("a", "a", "b", "c"), ids("b"), registered("a", "b"), looked_up=3,
                             joined=3)[WORK_UNIT_JOINED_ONCE]
    assert not passed
    assert (counts["duplicate_rows"], counts["also_unjoinable"], counts["not_registered"]) == (1, 1, 1)
    # Older than the registry's GC boundary is not registered either.
    passed, counts = results(ids("a"), ids(), registered("a", status="too_old"), looked_up=1, joined=1)[WORK_UNIT_JOINED_ONCE]
    assert not passed and counts["not_registered"] == 1


def test_a_click_looked_up_but_in_no_outcome_or_counted_but_not_written_fails():
    passed, counts = results(ids("a"), ids(), registered("a"), looked_up=3, joined=1, pending=1)[WORK_UNIT_ACCOUNTED_FOR]
    assert not passed and counts["unaccounted"] == 1
    passed, counts = results(ids(), ids(), registered(), looked_up=1, joined=1)[WORK_UNIT_ACCOUNTED_FOR]
    assert not passed and counts["rows_not_as_counted"] == 1


def test_a_retry_finds_its_rows_written_by_an_earlier_attempt():
    """Killed after its output was written: the retry reads the unit's rows from the whole table. Its
    clicks are held under its own token (counted joined, nothing new written) or, once the token was
    cleared, registered elsewhere (skipped): both pass."""
    for counts in ({"joined": 2}, {"skipped_registered": 2}):
        checked = results(ids("a", "b"), ids(), registered("a", "b"), first_attempt=False, looked_up=2, **counts)
        assert checked[WORK_UNIT_JOINED_ONCE][0] and checked[WORK_UNIT_ACCOUNTED_FOR][0], checked
