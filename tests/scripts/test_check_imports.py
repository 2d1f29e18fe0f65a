"""scripts/check_imports.py on the project itself, and on a planted upward import it must report."""

from resources.state.layout import REPO_ROOT as REPO


def test_the_project_keeps_its_layering_and_reports_each_package(run_script):
    result = run_script("check_imports.py", REPO)
    assert result.returncode == 0, result.stdout
    assert ("  resources.registry: api, click_caps, client, etcd_log, held_queries, log_entries, ownership, replica, "
            "replica_state, service, shards, work_claims") in result.stdout
    assert "      may import: resources, spark_ops\n" in result.stdout
    assert "inside resources: resources.runtime < resources.state < resources.spark" in result.stdout


def test_an_upward_import_fails_with_its_file_and_line(tmp_path, run_script):
    for package, body in (("resources", "from spark_ops.join import x\n"), ("spark_ops", "x = 1\n")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "m.py").write_text(body if package == "resources" else "")
        (tmp_path / package / "join.py").write_text("x = 1\n")
    result = run_script("check_imports.py", tmp_path)
    assert result.returncode == 1
    assert "resources/m.py:1: resources -> spark_ops: resources.m imports spark_ops.join" in result.stdout


def test_a_resources_subpackage_importing_a_higher_floor_fails(tmp_path, run_script):
    """Inside resources/, the state floor may not import the registry's (RESOURCE_FLOORS), and a
    subpackage with no floor is reported."""
    for package in ("resources", "resources/state", "resources/registry", "resources/extra"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "resources/registry/api.py").write_text("from resources.state.layout import x\n")
    (tmp_path / "resources/state/layout.py").write_text("x = 1\n")
    result = run_script("check_imports.py", tmp_path)
    assert result.returncode == 1 and "0 upward import(s)" in result.stdout, result.stdout
    assert "resources.extra: a subpackage of resources with no floor" in result.stdout
    (tmp_path / "resources/extra/__init__.py").unlink()
    (tmp_path / "resources/state/layout.py").write_text("from resources.registry.api import y\nx = 1\n")
    result = run_script("check_imports.py", tmp_path)
    assert result.returncode == 1
    assert ("resources/state/layout.py:1: resources.state -> resources.registry: "
            "resources.state.layout imports resources.registry.api") in result.stdout


def test_two_modules_of_one_name_are_reported(tmp_path, run_script):
    """No two product modules or packages share a name (a module `progress` in two packages, say)."""
    for package in ("resources", "resources/state", "photon"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "resources/state/progress.py").write_text("x = 1\n")
    (tmp_path / "photon/progress.py").write_text("y = 1\n")
    result = run_script("check_imports.py", tmp_path)
    assert result.returncode == 1
    assert "  progress: photon.progress, resources.state.progress" in result.stdout
