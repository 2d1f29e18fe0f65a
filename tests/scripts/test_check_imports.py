"""scripts/check_imports.py on the project itself, and on a planted upward import it must report."""

from resources.state.layout import REPO_ROOT as REPO


def test_the_project_keeps_its_layering_and_reports_each_package(run_script):
    result = run_script("check_imports.py", REPO)
    assert result.returncode == 0, result.stdout
    assert "  resources.registry: api, click_caps, client, ownership, service, shards, work_claims" in result.stdout
    assert "      may import: resources, spark_ops\n" in result.stdout


def test_an_upward_import_fails_with_its_file_and_line(tmp_path, run_script):
    for package, body in (("resources", "from spark_ops.join import x\n"), ("spark_ops", "x = 1\n")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "m.py").write_text(body if package == "resources" else "")
        (tmp_path / package / "join.py").write_text("x = 1\n")
    result = run_script("check_imports.py", tmp_path)
    assert result.returncode == 1
    assert "resources/m.py:1: resources -> spark_ops: resources.m imports spark_ops.join" in result.stdout
