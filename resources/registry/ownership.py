"""Active-active without waste (Photon §3.3.1, §4.4; Ubiq §3): which datacenter joins which click lines.

Every datacenter's click dispatcher sees the same files (replicas: same names, same bytes). Each
file has a preferred datacenter, chosen by rendezvous hashing among the datacenters that have held
a lease in the registry, so both start together without joining the same clicks, and a datacenter
that comes back gets its share back. A dispatcher, walking a file's new bytes from its own offset:

- skips a range another datacenter finished (`done`), without reading it: its clicks are joined,
  unjoinable, or pending in that datacenter; also `done_pending` unless that datacenter died (its
  pending clicks are its own, retried when it runs; once it died, the range is read again so that
  nothing waits on it);
- waits at a range another live datacenter claimed and has not finished, and at bytes whose
  preferred datacenter is another live one that has not claimed them yet;
- cuts everything else: its own share, and the share of a datacenter whose lease expired
  (takeover, within one lease of the kill). Bytes it has waited on at the same offset for
  `takeover_grace_seconds` it cuts too: a live owner that is stuck (a unit failed for good) must not
  stop the file. Two datacenters joining the same clicks is then only waste: the registry still
  lets one of them win each click.

A file's recorded ranges stay contiguous: the walk stops at the first byte it waits on.

A unit retried after its datacenter came back (`retry_share`) reads again only the bytes no other
datacenter finished meanwhile; of the rest it looks up the clicks it recorded in its ledger, the
only ones it may have registered (spark_ops/ingest.py: ledger_clicks).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from resources.registry.work_claims import DONE, DONE_PENDING

Range = tuple[str, int, int]


def preferred_dc(file: str, members: set[str]) -> str:
    """Rendezvous hashing: a file moves only when its preferred datacenter joins or leaves."""
    return max(sorted(members), key=lambda dc: hashlib.md5(f"{dc}\0{file}".encode()).digest())


@dataclass
class Share:
    cut: list[Range] = field(default_factory=list)  # this datacenter joins these
    skipped: list[Range] = field(default_factory=list)  # another datacenter finished these
    waiting: dict[str, list] = field(default_factory=dict)  # file -> [offset waited at, since]
    taken_over: dict[str, int] = field(default_factory=dict)  # datacenter -> bytes cut of its share


def finished_by_another(claim: dict, dc: str, died: set[str]) -> bool:
    """Whether another datacenter finished this claim's range: its clicks are joined, unjoinable or
    pending there, or were found registered by a unit of `dc` (whose retry finds them in its ledger).
    A range left pending by a datacenter that died counts as unfinished: nothing may wait on it."""
    return claim["dc"] != dc and (claim["state"] == DONE or (claim["state"] == DONE_PENDING and claim["dc"] not in died))


def lease_states(leases: dict[str, float | None]) -> tuple[set[str], set[str]]:
    """The datacenters whose lease holds (live) and those whose lease expired (died); the others
    released theirs and stopped."""
    held = {name: seconds_left > 0 for name, seconds_left in leases.items() if seconds_left is not None}
    return {name for name, live in held.items() if live}, {name for name, live in held.items() if not live}


def share_work(dc: str, ranges: list[Range], claims: list[dict], leases: dict[str, float],
               waiting_before: dict[str, list], grace_seconds: float, now: float) -> Share:
    """Splits this datacenter's new `ranges` (one per file, from its own offsets) by ownership.
    `claims`: every datacenter's claims on those files (resources/registry/work_claims.py); `leases`: every
    datacenter's seconds of lease left (negative: expired, it died; None: released, it stopped)."""
    live, died = lease_states(leases)
    members = set(leases) | {dc}
    share = Share()
    for file, start, end in ranges:
        others = sorted((c for c in claims if c["file"] == file and c["dc"] != dc and c["end"] > start
                         and c["start"] < end), key=lambda c: c["start"])
        pos = start
        while pos < end:
            covering = next((c for c in others if c["start"] <= pos < c["end"]), None)
            if covering is not None:
                stop, holder = min(covering["end"], end), covering["dc"]
                if finished_by_another(covering, dc, died):
                    share.skipped.append((file, pos, stop))
                    pos = stop
                    continue
                owner = holder
            else:
                stop = min([c["start"] for c in others if c["start"] > pos] + [end])
                owner = preferred_dc(file, members)
            if owner == dc or owner not in live:
                if owner != dc:
                    share.taken_over[owner] = share.taken_over.get(owner, 0) + stop - pos
                share.cut.append((file, pos, stop))
                pos = stop
                continue
            offset, since = waiting_before.get(file, (None, now))
            since = since if offset == pos else now
            if now - since < grace_seconds:
                share.waiting[file] = [pos, since]
                break
            share.taken_over[owner] = share.taken_over.get(owner, 0) + stop - pos
            share.cut.append((file, pos, stop))
            pos = stop
    return share


@dataclass
class RetryShare:
    """A retried click unit's ranges split by what the other datacenters did meanwhile."""

    read: list[Range] = field(default_factory=list)  # parsed again
    finished: list[Range] = field(default_factory=list)  # finished by another: only the unit's ledger clicks there


def retry_share(dc: str, ranges: list[Range], claims: list[dict], leases: dict[str, float | None]) -> RetryShare:
    """Splits a retried unit's `ranges` at the ranges other datacenters finished (`finished_by_another`)
    since it was cut, typically while this datacenter was down and another took its claims over.
    Claims' ranges start and end at line ends, as the ranges do: the pieces are whole lines."""
    _, died = lease_states(leases)
    share = RetryShare()
    for file, start, end in ranges:
        done = sorted((max(c["start"], start), min(c["end"], end)) for c in claims
                      if c["file"] == file and c["start"] < end and c["end"] > start and finished_by_another(c, dc, died))
        pos = start
        for low, high in done:
            if low > pos:
                share.read.append((file, pos, low))
            if high <= pos:
                continue
            last = share.finished[-1] if share.finished else None
            if last is not None and last[0] == file and last[2] >= low:  # overlapping or adjacent claims: one piece
                share.finished[-1] = (file, last[1], high)
            else:
                share.finished.append((file, max(low, pos), high))
            pos = high
        if pos < end:
            share.read.append((file, pos, end))
    return share


def divide_retry(registry, dc: str, ranges: list[Range]) -> RetryShare:
    """A retried click unit's ranges split by the claims and leases in the registry (`retry_share`)."""
    leases = registry.heartbeat(None, 0)
    claims = registry.work_claims("click", sorted({file for file, _, _ in ranges}))
    return retry_share(dc, ranges, claims, leases)


def shared_among_datacenters(stream: str, replicas: list[str]) -> bool:
    """Whether the datacenters divide this stream's new lines between them: clicks, once there is
    more than one replica. Query lines are not divided: each datacenter ingests its own replica."""
    return stream == "click" and len(replicas) > 1


def divide_clicks(registry, dc: str, ranges: list[Range], waiting_before: dict[str, list], grace_seconds: float,
                  now: float) -> Share:
    """This datacenter's share of the new click lines, by the leases and claims in the registry."""
    leases = registry.heartbeat(None, 0)
    claims = registry.work_claims("click", sorted({file for file, _, _ in ranges}))
    return share_work(dc, ranges, claims, leases, waiting_before, grace_seconds, now)


def claim_units(registry, dc: str, stream: str, units) -> None:
    """Claims work units in the registry before their runs are requested, so that the other
    datacenters wait for their bytes."""
    if units:
        registry.claim_work(dc, stream, [{"unit": u.id, "ranges": [list(r) for r in u.ranges]} for u in units])
