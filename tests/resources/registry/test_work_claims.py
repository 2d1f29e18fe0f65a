import time

from resources.registry.work_claims import WorkClaims


def test_leases_expire_and_release(tmp_path):
    work = WorkClaims.open(tmp_path / "work.duckdb")
    assert work.heartbeat(None, 0) == {}
    leases = work.heartbeat("dc1", 10)
    assert 9 < leases["dc1"] <= 10
    work.heartbeat("dc2", 0.05)
    time.sleep(0.1)
    leases = work.heartbeat(None, 0)
    assert leases["dc1"] > 0 and leases["dc2"] < 0
    # Released (a clean stop) reads differently from expired (a death).
    leases = work.heartbeat("dc1", 0)
    assert leases["dc1"] is None and leases["dc2"] < 0


def test_claims_are_recorded_once_finished_and_survive_a_restart(tmp_path):
    work = WorkClaims.open(tmp_path / "work.duckdb")
    unit = {"unit": "dc1.click.00000001", "ranges": [["a/0.jsonl", 0, 100], ["b/0.jsonl", 50, 80]]}
    assert work.claim("dc1", "click", [unit]) == 2
    work.claim("dc1", "click", [unit])  # re-requested after a crash: nothing changes
    assert [(c["file"], c["start"], c["end"], c["state"]) for c in work.claims("click", ["a/0.jsonl"])] == [
        ("a/0.jsonl", 0, 100, "claimed")]
    assert work.finish("dc1.click.00000001", pending=True) == 2
    assert work.finish("dc9.click.00000001", pending=False) == 0
    work.close()
    reopened = WorkClaims.open(tmp_path / "work.duckdb")
    claims = reopened.claims("click", ["a/0.jsonl", "b/0.jsonl"])
    assert {c["state"] for c in claims} == {"done_pending"} and all(c["finished_us"] for c in claims)
    assert reopened.claims("query", ["a/0.jsonl"]) == [] and reopened.claims("click", []) == []
