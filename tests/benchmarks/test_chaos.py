"""`benchmarks/chaos.py`: a scenario is drawn from its seed alone; and its smoke run, two short
scenarios (one `photon run`, one `photon up`) against the real pipeline, judged by the generator's
ground truth, with the faults they injected counted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.chaos import REGISTRY_FAULTS, RUN_FAULTS, UP_FAULTS, merge, scenario

REPO = Path(__file__).resolve().parents[2]


def test_a_scenario_is_drawn_from_its_seed():
    assert scenario(7, "up") == scenario(7, "up")
    assert scenario(7, "run") != scenario(8, "run")
    for seed in range(50):
        for mode, kinds in (("run", RUN_FAULTS), ("up", UP_FAULTS)):
            drawn = scenario(seed, mode)
            assert 1 <= len(drawn.faults) <= 3 and {kind for _, kind in drawn.faults} <= set(kinds)
            assert [at for at, _ in drawn.faults] == sorted(at for at, _ in drawn.faults)
            assert drawn.replay_command() == f"python benchmarks/chaos.py --replay {seed} --mode {mode} --replicated-share 0"
            replicated = scenario(seed, mode, replicated_share=1.0)
            assert replicated.replicas == 3 and {kind for _, kind in replicated.faults} & set(REGISTRY_FAULTS)
            assert "kill_registry" not in {kind for _, kind in replicated.faults}
            assert replicated.gen_options == drawn.gen_options  # the same workload, on another registry


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def test_runs_merge_only_on_the_product_code_checked_out_and_without_a_seed_twice(tmp_path):
    def result(name: str, commit: str, seeds: list[int]) -> Path:
        records = [{"seed": s, "mode": "run", "faults_injected": ["kill_registry"], "violations": []} for s in seeds]
        path = tmp_path / name
        path.write_text(json.dumps({"commit": commit, "command": name, "scenarios_planned": len(seeds),
                                    "wall_seconds": 10.0, "records": records}))
        return path

    head = git("rev-parse", "--short", "HEAD")
    merged = merge([result("a.json", head, [1, 2]), result("b.json", head, [3])])
    assert merged["scenarios"] == 3 and merged["faults_by_kind"] == {"kill_registry": 3}
    assert merged["wall_seconds"] == 20.0 and [m["file"] for m in merged["merged_from"]] == ["a.json", "b.json"]
    with pytest.raises(SystemExit, match="seeds played twice"):
        merge([result("a.json", head, [1, 2]), result("c.json", head, [2])])
    first = git("rev-list", "--max-parents=0", "HEAD").split()[0][:7]  # the project's first commit: other code
    with pytest.raises(SystemExit, match="not the product code"):
        merge([result("a.json", head, [1]), result("d.json", first, [4])])
    with pytest.raises(SystemExit, match="not the product code"):
        merge([result("e.json", head + "-dirty", [5])])


@pytest.mark.benchmarks
def test_two_scenarios_one_per_mode_find_nothing_lost_or_joined_twice(tmp_path):
    """Seeds drawn from the commit under test (printed): every landing tries scenarios no earlier one
    tried, on the smallest workload, in each mode. Their data and logs stay in the test's directory."""
    results = tmp_path / "results"
    results.mkdir()
    done = subprocess.run([sys.executable, "benchmarks/chaos.py", "--scenarios", "2", "--seed-from-commit", "--small",
                           "--up-every", "1", "--results-dir", str(results),
                           "--work-dir", str(tmp_path / "scenarios")], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith("seeds from commit ")
    (written,) = results.glob("*-chaos-*.json")
    result = json.loads(written.read_text())
    assert result["scenarios"] == 2 and result["scenarios_by_mode"] == {"up": 1, "run": 1}
    assert result["violations"] == 0 and result["violating_seeds"] == []
    assert sum(result["faults_by_kind"].values()) >= 1
    assert done.stdout.strip().splitlines()[-1].startswith("2 scenarios")
