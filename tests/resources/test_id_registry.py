"""The IdRegistry contract, on the embedded (in-process, sharded) registry, and the Dagster resource."""

import pickle

import dagster as dg
import pyarrow as pa
import pytest

from resources.id_registry import (
    MODE_ENV,
    IdRegistryResource,
    close_embedded_registries,
    embedded_registry,
    registry_resource_from_env,
)
from resources.registry.api import ADDRESS_ENV, SECRET_ENV
from resources.registry.client import RemoteIdRegistry
from resources.registry.shards import ShardedIdRegistry, now_us

NOW = now_us()


def events(*ids: str, ts: int = NOW) -> pa.Table:
    return pa.table({"click_id": list(ids), "timestamp_us": pa.array([ts] * len(ids), pa.int64())})


def statuses(table: pa.Table) -> dict[str, str]:
    return dict(zip(table.column("click_id").to_pylist(), table.column("status").to_pylist()))


@pytest.fixture(params=[1, 3], ids=["1-shard", "3-shards"])
def registry(tmp_path, request):
    registry = ShardedIdRegistry(tmp_path / "registry", shards=request.param, gc_interval_seconds=None)
    yield registry
    registry.close()


def test_conditional_commit_with_retry_token(registry):
    assert statuses(registry.commit(events("a", "b"), "unit-1")) == {"a": "held", "b": "held"}
    # Another work unit is refused the ids it shares; a retry of unit-1 gets its own back.
    assert statuses(registry.commit(events("b", "c"), "unit-2")) == {"b": "refused", "c": "held"}
    assert statuses(registry.commit(events("a", "b", "d"), "unit-1")) == {"a": "held", "b": "held", "d": "held"}


def test_duplicates_within_one_batch_are_one_id_with_the_earliest_timestamp(registry):
    batch = pa.table({"click_id": ["a", "a", "a"], "timestamp_us": [NOW + 2, NOW, NOW + 1]})
    assert registry.commit(batch, "unit-1").to_pylist() == [{"click_id": "a", "status": "held"}]
    assert registry.scan().read_all().to_pylist() == [{"click_id": "a", "timestamp_us": NOW, "token": "unit-1"}]
    assert registry.stats()["total"]["ids_registered"] == 1


def test_cleared_tokens_keep_ids_registered_and_refused(registry):
    registry.commit(events("a", "b"), "unit-1")
    assert registry.clear_tokens("unit-1") == 2
    assert statuses(registry.commit(events("a"), "unit-1")) == {"a": "refused"}
    assert registry.lookup(events("a", "z")).to_pylist() == [{"click_id": "a", "token": None, "status": "registered"}]
    assert registry.stats()["total"]["ids_with_token"] == 0


def test_lookup_reports_tokens_and_accepts_readers_and_other_string_types(registry):
    registry.commit(events("a", "b"), "unit-1")
    ids = pa.table({"click_id": pa.array(["a", "b", "c"], pa.large_string()), "timestamp_us": [NOW] * 3})
    found = registry.lookup(ids.to_reader()).sort_by("click_id").to_pylist()
    assert found == [{"click_id": "a", "token": "unit-1", "status": "registered"},
                     {"click_id": "b", "token": "unit-1", "status": "registered"}]


def test_delete_unregisters_and_counts_what_existed(registry):
    registry.commit(events("a", "b"), "unit-1")
    assert registry.delete(events("a", "zz")) == 1
    assert statuses(registry.commit(events("a"), "unit-2")) == {"a": "held"}


def test_input_without_timestamps_is_a_clear_error(registry):
    with pytest.raises(ValueError, match="lacks column"):
        registry.commit(pa.table({"click_id": ["a"]}), "unit-1")


def test_commits_survive_reopening(tmp_path):
    registry = ShardedIdRegistry(tmp_path / "registry", shards=2, gc_interval_seconds=None)
    registry.commit(events("a", "b"), "unit-1")
    registry.close()
    reopened = ShardedIdRegistry(tmp_path / "registry", gc_interval_seconds=None)
    assert statuses(reopened.commit(events("a", "c"), "unit-2")) == {"a": "refused", "c": "held"}
    assert set(reopened.scan().read_all().column("click_id").to_pylist()) == {"a", "b", "c"}
    reopened.close()


def test_resource_modes(tmp_path):
    try:
        embedded = IdRegistryResource(data_dir=str(tmp_path)).get()
        assert isinstance(embedded, ShardedIdRegistry)
        assert embedded.directory == (tmp_path / "registry").resolve()
        assert embedded is embedded_registry(tmp_path / "registry")  # one per directory per process
    finally:
        close_embedded_registries()
    remote = IdRegistryResource(data_dir=str(tmp_path), mode="service", address="127.0.0.1:9", secret="s").get()
    assert isinstance(remote, RemoteIdRegistry)
    copy = pickle.loads(pickle.dumps(remote))  # no connection is made or carried
    assert (copy.address, copy.secret) == ("127.0.0.1:9", "s")
    with pytest.raises(dg.Failure, match="needs an address"):
        IdRegistryResource(data_dir=str(tmp_path), mode="service").get()
    with pytest.raises(dg.Failure, match="unknown registry mode 'paxos'"):
        IdRegistryResource(data_dir=str(tmp_path), mode="paxos").get()


def test_the_secret_from_the_environment_stays_out_of_run_config_unless_resolved(tmp_path, monkeypatch):
    monkeypatch.setenv(ADDRESS_ENV, "127.0.0.1:9")
    monkeypatch.setenv(SECRET_ENV, "hunter2")
    monkeypatch.delenv(MODE_ENV, raising=False)
    for_runs = registry_resource_from_env(str(tmp_path))
    assert isinstance(for_runs.secret, dg.EnvVar)  # Dagster resolves it where it builds the resource
    with dg.build_resources({"registry": for_runs}) as built:
        assert built.registry.get().secret == "hunter2"
    # The sensors and `photon run`'s leases use the resource as it is: its value, not the variable's name.
    assert registry_resource_from_env(str(tmp_path), resolved=True).get().secret == "hunter2"
