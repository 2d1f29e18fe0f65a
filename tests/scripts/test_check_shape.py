"""scripts/check_shape.py on the project itself, and on planted code it must report."""

from resources.state.layout import REPO_ROOT as REPO


def test_the_product_code_keeps_its_shape(run_script):
    result = run_script("check_shape.py", REPO)
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("OK: ")


def test_a_long_function_many_parameters_and_a_renamed_copy_are_reported(tmp_path, run_script):
    (tmp_path / "spark_ops").mkdir()
    long_body = "".join(f"    x{i} = {i}\n" for i in range(61))
    block = "    total = 0\n    for item in items:\n        total += item.size\n        if total > limit:\n" \
            "            break\n    print(total)\n    return total\n"
    (tmp_path / "spark_ops" / "a.py").write_text(
        f"def long():\n{long_body}\n\ndef many(a, b, c, d, e, f, g, h, i):\n    return a\n\n\n"
        f"def first(items, limit):\n{block}")
    (tmp_path / "spark_ops" / "b.py").write_text(f"def second(things, cap):\n{block.replace('items', 'things').replace('limit', 'cap')}")
    result = run_script("check_shape.py", tmp_path)
    assert result.returncode == 1
    assert "spark_ops/a.py:1 long: 62 lines (at most 60)" in result.stdout
    assert "spark_ops/a.py:65 many: 9 parameters (at most 8)" in result.stdout
    assert "repeated by shape: spark_ops/a.py:70-76, spark_ops/b.py:2-8" in result.stdout
