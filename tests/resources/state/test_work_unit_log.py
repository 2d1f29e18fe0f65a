from resources.state.work_unit_log import WorkUnit, WorkUnitLog, complete_end, cut_work_units, new_ranges


def test_torn_last_line_is_left_for_later(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"x":1}\n{"x":2}\n{"x"')
    assert complete_end(path, 0, path.stat().st_size) == 16
    assert new_ranges(tmp_path, {}) == [("a.jsonl", 0, 16)]
    assert new_ranges(tmp_path, {"a.jsonl": 16}) == []
    with open(path, "ab") as f:
        f.write(b":3}\n")
    assert new_ranges(tmp_path, {"a.jsonl": 16}) == [("a.jsonl", 16, 24)]


def test_work_units_are_bounded_and_split_on_lines(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"".join(b"x" * 9 + b"\n" for _ in range(10)))
    (tmp_path / "b.jsonl").write_bytes(b"y" * 50 + b"\n")
    units = cut_work_units(tmp_path, new_ranges(tmp_path, {}), 25, "dc1.click", 3)
    assert [u.ranges for u in units] == [
        (("a.jsonl", 0, 20),), (("a.jsonl", 20, 40),), (("a.jsonl", 40, 60),),
        (("a.jsonl", 60, 80),), (("a.jsonl", 80, 100),),
        (("b.jsonl", 0, 51),),  # one line longer than a unit is a unit of its own
    ]
    assert [u.id for u in units][:2] == ["dc1.click.00000003", "dc1.click.00000004"]
    packed = cut_work_units(tmp_path, new_ranges(tmp_path, {}), 1000, "dc1.click", 0)
    assert [u.ranges for u in packed] == [(("a.jsonl", 0, 100), ("b.jsonl", 0, 51))]


def test_log_survives_a_torn_append(tmp_path):
    log = WorkUnitLog.load(tmp_path / "click.jsonl")
    log.append([WorkUnit("u.0", 0, (("a.jsonl", 0, 10),))])
    with open(log.path, "a") as f:
        f.write('{"id": "u.1", "se')
    # A reader without the lock leaves the tail alone: another writer may be appending it.
    assert [u.id for u in WorkUnitLog.load(log.path).units] == ["u.0"]
    assert log.path.read_text().endswith('"se')
    with WorkUnitLog.locked(log.path) as reloaded:
        assert [u.id for u in reloaded.units] == ["u.0"]
        assert reloaded.next_offsets() == {"a.jsonl": 10}
        reloaded.append([WorkUnit("u.1", 1, (("a.jsonl", 10, 20),))])
    assert [u.id for u in WorkUnitLog.load(log.path).units] == ["u.0", "u.1"]
