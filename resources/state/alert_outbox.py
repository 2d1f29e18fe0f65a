"""The alerts' durable outbox under a data directory (`state/alerts/`): the alert sensor (sensors/alerts.py)
puts each message there, named by the identity of the event it reports, and `photon up`'s sender
(photon/alert_sender.py) posts it to the webhook off the sensors' threads, retrying with backoff.

- `outbox/<key>.json`: a message to send, with its attempts so far and when the next may start;
- `sent/<key>.json`: a message the webhook accepted (kept `SENT_KEPT_SECONDS`): putting a message again
  under the same key (a tick that died before its cursor was stored, run again) adds nothing.

Each file is written whole and renamed into place: a crash leaves the old version or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

SENT_KEPT_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class Pending:
    path: Path
    message: dict
    attempts: int
    next_at: float


class AlertOutbox:
    def __init__(self, root: Path):
        self.root = root
        self.outbox, self.sent_dir = root / "outbox", root / "sent"

    @staticmethod
    def file_name(key: str) -> str:
        """A file name for an event's identity (any text): readable, and unique by its hash."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)[:80]
        return f"{safe}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"

    def put(self, key: str, message: dict) -> bool:
        """Queues `message` under `key` unless a message of that key is queued or was sent."""
        name = self.file_name(key)
        if (self.outbox / name).exists() or (self.sent_dir / name).exists():
            return False
        _write(self.outbox / name, {"key": key, "message": message, "attempts": 0, "next_at": 0.0,
                                    "queued_at": time.time()})
        return True

    def due(self, now: float) -> list[Pending]:
        """The queued messages whose next attempt may start, oldest first."""
        found = []
        for path in sorted(self.outbox.glob("*.json")) if self.outbox.is_dir() else []:
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # renamed away meanwhile
            if entry["next_at"] <= now:
                found.append((entry.get("queued_at", 0.0), Pending(path, entry["message"], entry["attempts"],
                                                                   entry["next_at"])))
        return [pending for _, pending in sorted(found, key=lambda item: item[0])]

    def delivered(self, pending: Pending) -> None:
        self.sent_dir.mkdir(parents=True, exist_ok=True)
        os.replace(pending.path, self.sent_dir / pending.path.name)

    def retry_later(self, pending: Pending, delay_seconds: float, error: str) -> None:
        entry = json.loads(pending.path.read_text())
        entry.update(attempts=pending.attempts + 1, next_at=time.time() + delay_seconds, last_error=error[:500])
        _write(pending.path, entry)

    def forget_old_sent(self, now: float) -> None:
        for path in self.sent_dir.glob("*.json") if self.sent_dir.is_dir() else []:
            try:
                if now - path.stat().st_mtime > SENT_KEPT_SECONDS:
                    path.unlink()
            except FileNotFoundError:
                pass


def _write(path: Path, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(entry, sort_keys=True))
    partial.replace(path)
