import os

from resources.state.work_unit_log import (
    FULL_LISTING_SECONDS, WorkUnit, WorkUnitLog, complete_end, cut_work_units, log_files, new_ranges,
)


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


def test_the_logs_are_listed_as_rglob_lists_them_oldest_first(tmp_path):
    """Nested writer directories, files of other kinds, a symlinked directory (not entered, as
    Path.rglob does not), a symlinked file (listed), a dangling symlink (left out)."""
    stream = tmp_path / "stream"
    for i, name in enumerate(["w2/00001.jsonl", "w1/00000.jsonl", "w1/deep/00000.jsonl", "w2/00000.jsonl",
                              "w1/notes.txt", ".hidden/00000.jsonl"]):
        path = stream / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"{}\n" * (i + 1))
        os.utime(path, ns=(10**18 + i, 10**18 + i))  # written in this order
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.jsonl").write_bytes(b"{}\n")
    (stream / "linked_dir").symlink_to(tmp_path / "elsewhere")
    (stream / "linked.jsonl").symlink_to(stream / "w2" / "00000.jsonl")
    (stream / "dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")

    listed = [(rel, size) for _, rel, _, size in log_files(stream)]
    by_rglob = sorted((p.stat().st_mtime_ns, str(p.relative_to(stream)), p.stat().st_size)
                      for p in stream.rglob("*.jsonl") if p.exists())
    assert listed == [(rel, size) for _, rel, size in by_rglob]
    # By time (a symlink has its target's), then name.
    assert [rel for rel, _ in listed] == ["w2/00001.jsonl", "w1/00000.jsonl", "w1/deep/00000.jsonl", "linked.jsonl",
                                          "w2/00000.jsonl", ".hidden/00000.jsonl"]
    assert log_files(tmp_path / "missing") == []


def test_a_quiet_file_is_stated_again_at_the_next_full_listing_and_a_new_file_at_once(tmp_path):
    old = tmp_path / "w1" / "00000.jsonl"
    old.parent.mkdir()
    old.write_bytes(b"{}\n")
    os.utime(old, (1_000, 1_000))  # quiet: written long ago
    now = 2_000.0
    assert [(rel, size) for _, rel, _, size in log_files(tmp_path, now)] == [("w1/00000.jsonl", 3)]
    with open(old, "ab") as f:
        f.write(b"{}\n")
    (tmp_path / "w1" / "00001.jsonl").write_bytes(b"{}\n")
    # Between full listings: the quiet file as last seen, the new one at once.
    listed = {rel: size for _, rel, _, size in log_files(tmp_path, now + FULL_LISTING_SECONDS / 2)}
    assert listed == {"w1/00000.jsonl": 3, "w1/00001.jsonl": 3}
    # The next full listing sees the appended line: late, never lost.
    listed = {rel: size for _, rel, _, size in log_files(tmp_path, now + FULL_LISTING_SECONDS)}
    assert listed == {"w1/00000.jsonl": 6, "w1/00001.jsonl": 3}
