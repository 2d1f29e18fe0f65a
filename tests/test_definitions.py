import importlib
import shutil
import subprocess
import sys
from pathlib import Path

from resources.state.layout import REPO_ROOT
from spark_ops.tables import TABLE_SCHEMAS
from tests.conftest import query, write_lines


def test_definitions_load_with_sensors_per_datacenter(tmp_path, monkeypatch):
    for dc in ("dc1", "dc2"):
        write_lines(tmp_path / "logs" / dc / "query" / "w" / "0.jsonl", [query("1.1.1.1:1:1", 1)])
    monkeypatch.setenv("PHOTON_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("PHOTON_DATACENTERS", raising=False)
    import definitions

    defs = importlib.reload(definitions).defs
    sys.modules.pop("definitions")  # built for this test's datacenters: the next import builds its own
    repo = defs.get_repository_def()
    assert {s.name for s in repo.sensor_defs} == {
        f"{kind}_{dc}" for dc in ("dc1", "dc2")
        for kind in ("query_log_dispatcher", "click_log_dispatcher", "pending_click_dispatcher")
    } | {"click_aggregates_refresher", "table_checker", "table_maintenance", "photon_alerts"}
    # Dagster would build a sensor's resources, and an instance for them, on every tick (sensors/deps.py).
    assert [s.name for s in repo.sensor_defs if s.required_resource_keys] == []
    assert {job.name for job in repo.get_all_jobs()} >= {"ingest_queries", "join_clicks_job", "check_tables", "verify"}
    assert {str(key.to_user_string()) for key in repo.asset_graph.get_all_asset_keys()} == {
        "query_logs", "log_file_map", "click_ledger", "joined_clicks", "unjoinable_clicks", "click_aggregates",
        "pending_clicks", "quarantined_lines"}
    # ALL_CHECKS and the two a click run makes of what it wrote
    assert len(repo.asset_graph.asset_check_keys) == 8
    # Freshness is the assets' FreshnessPolicy (photon_assets/freshness.py), evaluated by Dagster's daemon.
    policies = {key.to_user_string(): repo.asset_graph.get(key).freshness_policy
                for key in repo.asset_graph.get_all_asset_keys()}
    assert {name for name, policy in policies.items() if policy} == {"joined_clicks", "click_aggregates"}
    assert (policies["joined_clicks"].fail_window.to_timedelta().total_seconds(),
            policies["joined_clicks"].warn_window.to_timedelta().total_seconds()) == (600, 300)
    # Each asset shows its Delta table's columns in the UI before anything is materialized.
    for key in repo.asset_graph.get_all_asset_keys():
        schema = repo.asset_graph.get(key).metadata["dagster/column_schema"]
        assert [c.name for c in schema.columns] == TABLE_SCHEMAS[key.to_user_string()][0].fieldNames()


def test_workspace_validates(tmp_path):
    env = {"PHOTON_DATA_DIR": str(tmp_path), "DAGSTER_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(REPO_ROOT / "workspace.yaml")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Validation successful for code location photon" in result.stdout + result.stderr


DG = Path(sys.executable).parent / "dg"
# The project's files `dg` reads: pyproject.toml's [tool.dg], definitions.py and the packages it imports.
PROJECT = ("pyproject.toml", "definitions.py", "workspace.yaml", "photon", "photon_assets", "sensors", "resources",
           "spark_ops")


def dg_check_defs(project: Path, data_dir: Path) -> subprocess.CompletedProcess:
    env = {"PHOTON_DATA_DIR": str(data_dir), "DAGSTER_HOME": str(data_dir), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(DG), "check", "defs"], cwd=project, env=env, capture_output=True, text=True, timeout=180)


def test_dg_check_defs(tmp_path):
    """`dg check defs` from the repository root, as CI runs it beside `dagster definitions validate`."""
    result = dg_check_defs(REPO_ROOT, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "All definitions loaded successfully." in result.stdout + result.stderr


def test_dg_check_defs_fails_on_a_broken_definition(tmp_path):
    """A copy of the project whose click job selects an asset no definition supplies: `dg check defs` exits 1."""
    project = tmp_path / "project"
    for name in PROJECT:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, project / name)
    for shared in (".venv", ".cache"):  # the environment, Delta's jars
        (project / shared).symlink_to(REPO_ROOT / shared)
    jobs = project / "photon_assets" / "jobs.py"
    jobs.write_text(jobs.read_text().replace('"click_ledger", "joined_clicks"', '"click_ledger", "no_such_asset"'))
    result = dg_check_defs(project, tmp_path / "data")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "no_such_asset" in result.stdout + result.stderr
