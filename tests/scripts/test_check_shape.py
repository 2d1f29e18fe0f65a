"""scripts/check_shape.py on the project itself, and on planted code it must report."""

from resources.state.layout import REPO_ROOT as REPO

README_LIMIT = 250
# Functions over the limits in modules another change is rewriting now, left to it (not edited here).
# Each must still be reported: once one is not, its entry goes.
LEFT_TO_OTHER_CHANGES: list[tuple[str, str]] = []


def shape_problems(run_script) -> list[str]:
    result = run_script("check_shape.py", REPO)
    *problems, summary = result.stdout.splitlines() or [""]
    assert summary.startswith(("OK: ", "FAIL: ")), result.stderr
    return problems


def reported(problem: str, path: str, name: str) -> bool:
    return problem.startswith(f"{path}:") and f" {name}: " in problem


def test_the_product_code_keeps_its_shape(run_script):
    code = [p for p in shape_problems(run_script) if not p.startswith("README.md: ")]
    assert [p for p in code if not any(reported(p, *left) for left in LEFT_TO_OTHER_CHANGES)] == []
    # Within the limits now: take it out of LEFT_TO_OTHER_CHANGES.
    assert [left for left in LEFT_TO_OTHER_CHANGES if not any(reported(p, *left) for p in code)] == []


def test_the_readme_keeps_its_length(run_script):
    assert [p for p in shape_problems(run_script) if p.startswith("README.md: ")] == []


def test_a_long_function_many_parameters_and_a_renamed_copy_are_reported(tmp_path, run_script):
    (tmp_path / "spark_ops").mkdir()
    long_body = "".join(f"    x{i} = {i}\n" for i in range(50))
    block = "    total = 0\n    for item in items:\n        total += item.size\n        if total > limit:\n" \
            "            break\n    print(total)\n    return total\n"
    (tmp_path / "spark_ops" / "a.py").write_text(
        f"def long():\n{long_body}\n\ndef many(a, b, c, d, e, f, g, h):\n    return a\n\n\n"
        f"def first(items, limit):\n{block}")
    (tmp_path / "spark_ops" / "b.py").write_text(f"def second(things, cap):\n{block.replace('items', 'things').replace('limit', 'cap')}")
    result = run_script("check_shape.py", tmp_path)
    assert result.returncode == 1
    assert "spark_ops/a.py:1 long: 51 lines (at most 50)" in result.stdout
    assert "spark_ops/a.py:54 many: 8 parameters (at most 7)" in result.stdout
    assert "repeated by shape: spark_ops/a.py:59-65, spark_ops/b.py:2-8" in result.stdout


def test_a_readme_over_its_limit_is_reported(tmp_path, run_script):
    (tmp_path / "spark_ops").mkdir()
    (tmp_path / "spark_ops" / "a.py").write_text("def short():\n    return 1\n")
    (tmp_path / "README.md").write_text("line\n" * README_LIMIT)
    assert run_script("check_shape.py", tmp_path).returncode == 0
    (tmp_path / "README.md").write_text("line\n" * (README_LIMIT + 1))
    result = run_script("check_shape.py", tmp_path)
    assert result.returncode == 1
    assert f"README.md: {README_LIMIT + 1} lines (at most {README_LIMIT})" in result.stdout
