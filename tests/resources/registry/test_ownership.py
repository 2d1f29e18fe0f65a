from resources.registry.ownership import preferred_dc, retry_share, share_work


BOTH = {"dc1": 10.0, "dc2": 10.0}  # leases: seconds left
DC2_GONE = {"dc1": 10.0, "dc2": -3.0}  # expired: dc2 died
DC2_STOPPED = {"dc1": 10.0, "dc2": None}  # released: dc2 stopped cleanly


def claim(dc, file, start, end, state="claimed", unit="u"):
    return {"unit": unit, "dc": dc, "file": file, "start": start, "end": end, "state": state}


def files_of(dc, members, count=200):
    return [f"w/{i:05d}.jsonl" for i in range(count) if preferred_dc(f"w/{i:05d}.jsonl", members) == dc]


def test_preferred_datacenter_is_stable_balanced_and_moves_only_with_its_datacenter():
    files = [f"w/{i:05d}.jsonl" for i in range(400)]
    two = {f: preferred_dc(f, {"dc1", "dc2"}) for f in files}
    assert 150 < sum(dc == "dc1" for dc in two.values()) < 250
    three = {f: preferred_dc(f, {"dc1", "dc2", "dc3"}) for f in files}
    # A third datacenter takes files from both; no file moves between the first two.
    assert all(three[f] in (two[f], "dc3") for f in files)
    assert {f: preferred_dc(f, {"dc2", "dc1"}) for f in files} == two


def test_own_share_is_cut_and_a_live_datacenters_share_waits():
    mine, theirs = files_of("dc1", {"dc1", "dc2"})[0], files_of("dc2", {"dc1", "dc2"})[0]
    share = share_work("dc1", [(mine, 0, 100), (theirs, 0, 100)], [], BOTH, {}, 120, now=1000.0)
    assert share.cut == [(mine, 0, 100)] and share.skipped == []
    assert share.waiting == {theirs: [0, 1000.0]} and share.taken_over == {}
    # The other datacenter's lease lapsed: its share is taken over.
    share = share_work("dc1", [(theirs, 0, 100)], [], DC2_GONE, {}, 120, now=1000.0)
    assert share.cut == [(theirs, 0, 100)] and share.taken_over == {"dc2": 100}
    share = share_work("dc1", [(theirs, 0, 100)], [], DC2_STOPPED, {}, 120, now=1000.0)
    assert share.cut == [(theirs, 0, 100)] and share.taken_over == {"dc2": 100}


def test_finished_ranges_are_skipped_and_claimed_ones_wait_for_their_live_owner():
    mine = files_of("dc1", {"dc1", "dc2"})[0]
    claims = [claim("dc2", mine, 0, 40, "done"), claim("dc2", mine, 40, 70, "claimed")]
    share = share_work("dc1", [(mine, 0, 100)], claims, BOTH, {}, 120, now=5.0)
    # Skipped up to the claimed range, then the walk stops there: recorded offsets stay contiguous.
    assert share.skipped == [(mine, 0, 40)] and share.cut == [] and share.waiting == {mine: [40, 5.0]}
    # The claimer died: its unfinished range and the rest of the file are this datacenter's.
    share = share_work("dc1", [(mine, 0, 100)], claims, DC2_GONE, {}, 120, now=5.0)
    assert share.skipped == [(mine, 0, 40)] and share.cut == [(mine, 40, 70), (mine, 70, 100)]
    assert share.taken_over == {"dc2": 30}


def test_a_range_left_with_pending_clicks_is_read_again_once_its_datacenter_died():
    mine = files_of("dc1", {"dc1", "dc2"})[0]
    claims = [claim("dc2", mine, 0, 50, "done_pending")]
    for leases in (BOTH, DC2_STOPPED):  # its pending clicks are retried when it runs
        kept = share_work("dc1", [(mine, 0, 50)], claims, leases, {}, 120, now=0.0)
        assert kept.skipped == [(mine, 0, 50)] and kept.cut == []
    gone = share_work("dc1", [(mine, 0, 50)], claims, DC2_GONE, {}, 120, now=0.0)
    assert gone.skipped == [] and gone.cut == [(mine, 0, 50)]


def test_a_share_stuck_at_one_offset_for_the_grace_is_taken_over():
    theirs = files_of("dc2", {"dc1", "dc2"})[0]
    first = share_work("dc1", [(theirs, 10, 90)], [], BOTH, {}, 120, now=100.0)
    assert first.waiting == {theirs: [10, 100.0]}
    still = share_work("dc1", [(theirs, 10, 90)], [], BOTH, first.waiting, 120, now=219.0)
    assert still.cut == [] and still.waiting == {theirs: [10, 100.0]}
    # The owner moved on meanwhile: the wait starts again at the new offset.
    moved = share_work("dc1", [(theirs, 30, 90)], [], BOTH, first.waiting, 120, now=219.0)
    assert moved.waiting == {theirs: [30, 219.0]}
    late = share_work("dc1", [(theirs, 10, 90)], [], BOTH, first.waiting, 120, now=220.0)
    assert late.cut == [(theirs, 10, 90)] and late.waiting == {} and late.taken_over == {"dc2": 80}


def test_own_claims_do_not_count_and_a_lone_datacenter_owns_everything():
    files = [f"w/{i:05d}.jsonl" for i in range(20)]
    share = share_work("dc1", [(f, 0, 10) for f in files], [claim("dc1", files[0], 0, 10)], {}, {}, 120, now=0.0)
    assert share.cut == [(f, 0, 10) for f in files] and share.taken_over == {}


def test_a_retry_reads_again_only_what_no_other_datacenter_finished():
    claims = [claim("dc1", "a", 0, 300, unit="mine"),  # the retried unit's own claim: not a reason to skip
              claim("dc2", "a", 100, 200, "done"), claim("dc2", "a", 150, 250, "done"),  # overlapping takeovers
              claim("dc2", "b", 0, 50, "claimed"),  # under way: not finished
              claim("dc2", "b", 50, 80, "done_pending"), claim("dc2", "c", 0, 40, "done_pending")]
    ranges = [("a", 0, 300), ("b", 0, 100), ("c", 0, 40)]
    share = retry_share("dc1", ranges, claims, BOTH)
    assert share.read == [("a", 0, 100), ("a", 250, 300), ("b", 0, 50), ("b", 80, 100)]
    assert share.finished == [("a", 100, 250), ("b", 50, 80), ("c", 0, 40)]
    # Pending clicks of a datacenter that died wait on nobody: those ranges are read again.
    gone = retry_share("dc1", ranges, claims, DC2_GONE)
    assert gone.read == [("a", 0, 100), ("a", 250, 300), ("b", 0, 100), ("c", 0, 40)]
    assert gone.finished == [("a", 100, 250)]
    # A claim reaching past the unit's range covers only the unit's part.
    assert retry_share("dc1", [("a", 120, 180)], claims, BOTH).finished == [("a", 120, 180)]
    assert retry_share("dc1", [("d", 0, 10)], claims, BOTH).read == [("d", 0, 10)]
