import pyarrow as pa

from resources.registry import EmbeddedIdRegistry


def events(*ids: str) -> pa.Table:
    return pa.table({"click_id": list(ids), "timestamp_us": list(range(len(ids)))})


def ids(reader) -> set[str]:
    return set(reader.read_all().column("click_id").to_pylist())


def test_conditional_commit_with_retry_token(tmp_path):
    registry = EmbeddedIdRegistry(tmp_path / "ids.duckdb")
    assert ids(registry.commit(events("a", "b"), "unit-1")) == {"a", "b"}
    # Another work unit is refused the ids it shares; a retry of unit-1 gets its own back.
    assert ids(registry.commit(events("b", "c"), "unit-2")) == {"c"}
    assert ids(registry.commit(events("a", "b", "d"), "unit-1")) == {"a", "b", "d"}


def test_duplicates_within_one_batch_are_one_id(tmp_path):
    registry = EmbeddedIdRegistry(tmp_path / "ids.duckdb")
    assert ids(registry.commit(events("a", "a", "a"), "unit-1")) == {"a"}
    assert registry.stats()["ids_registered"] == 1


def test_cleared_tokens_keep_ids_registered_and_refused(tmp_path):
    registry = EmbeddedIdRegistry(tmp_path / "ids.duckdb")
    registry.commit(events("a", "b"), "unit-1")
    assert registry.clear_tokens("unit-1") == 2
    assert ids(registry.commit(events("a"), "unit-1")) == set()
    assert registry.lookup(events("a", "z")).read_all().to_pylist() == [{"click_id": "a", "token": None}]
    assert registry.stats()["ids_with_token"] == 0


def test_commits_survive_reopening_the_file(tmp_path):
    registry = EmbeddedIdRegistry(tmp_path / "ids.duckdb")
    registry.commit(events("a", "b"), "unit-1")
    registry.close()
    reopened = EmbeddedIdRegistry(tmp_path / "ids.duckdb")
    assert ids(reopened.commit(events("a", "c"), "unit-2")) == {"c"}
    assert ids(reopened.scan()) == {"a", "b", "c"}
