"""The sidecar documents of resources/state/sidecars.py that have rules of their own."""

from resources.state.sidecars import Removals

HOUR = 3600.0


def test_a_table_is_vacuumed_once_a_removal_is_older_than_the_retention_and_keeps_the_younger_ones(tmp_path):
    path = tmp_path / "removals.json"
    removals = Removals.load(path)
    removals.add("click_ledger", 1000.0)
    removals.add("click_ledger", 1000.0 + HOUR)
    removals.add("joined_clicks", 1000.0 + HOUR)
    # Right after the removals a VACUUM would delete nothing: none is due.
    assert removals.due(1, 1001.0) == []
    assert removals.due(1, 1000.0 + HOUR - 1) == []
    assert removals.due(1, 1000.0 + HOUR + 1) == ["click_ledger"]
    # The VACUUM deleted the first removal's files; the second's are younger than the retention.
    removals.vacuumed("click_ledger", 1, 1000.0 + HOUR + 1)
    assert removals.removed_at["click_ledger"] == [1000.0 + HOUR]
    removals.save(path)
    later = Removals.load(path)
    assert later.due(1, 1000.0 + 2 * HOUR + 1) == ["click_ledger", "joined_clicks"]
    later.vacuumed("joined_clicks", 1, 1000.0 + 2 * HOUR + 1)
    assert "joined_clicks" not in later.removed_at
    # With no retention (tests, a deployment that keeps no old snapshot), every removal is due at once.
    assert Removals(removed_at={"log_file_map": [5.0]}).due(0, 5.0) == ["log_file_map"]
