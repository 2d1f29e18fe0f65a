"""`photon up`'s alert sender: a thread of its own posting the outbox's messages (resources/state/alert_outbox.py,
put there by the alert sensor, sensors/alerts.py) to the webhook of PHOTON_ALERT_WEBHOOK, one JSON body each.

A webhook that refuses (an HTTP error status), cannot be reached or does not answer within
POST_TIMEOUT_SECONDS is tried again after a backoff (2 s doubling, 300 s at most), for as long as the
message is queued: a message is dropped only once the webhook accepted it. Nothing here stops or slows the
pipeline: the sensor only writes a file, and this thread catches every error. Messages queued while
`photon up` was down are sent at its next start.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Iterator

from resources.state.alert_outbox import AlertOutbox
from sensors.alerts import WEBHOOK_ENV

SEND_EVERY_SECONDS = 1.0
POST_TIMEOUT_SECONDS = 5.0
BACKOFF_SECONDS, BACKOFF_MAX_SECONDS = 2.0, 300.0


def backoff(attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt (1, 2, ...)."""
    return min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2 ** (attempts - 1))


def post(webhook: str, body: dict) -> None:
    """Raises unless the webhook answers 2xx within POST_TIMEOUT_SECONDS."""
    request = urllib.request.Request(webhook, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=POST_TIMEOUT_SECONDS) as answer:
        if not 200 <= answer.status < 300:
            raise urllib.error.HTTPError(webhook, answer.status, "not accepted", answer.headers, None)


def send_due(outbox: AlertOutbox, webhook: str, log: logging.Logger) -> int:
    """One pass over the messages due; returns how many the webhook accepted. After a failure the pass
    stops: the webhook is down, and the next messages would wait for the same timeout."""
    sent = 0
    for pending in outbox.due(time.time()):
        try:
            post(webhook, pending.message)
        except Exception as error:  # noqa: BLE001 - any failure is a retry, never an exit
            retried_in = backoff(pending.attempts + 1)
            outbox.retry_later(pending, retried_in, repr(error))
            log.warning("alert %s not delivered (%s); attempt %d again in %.0f s", pending.path.name, error,
                        pending.attempts + 2, retried_in)
            return sent
        outbox.delivered(pending)
        sent += 1
    return sent


@contextmanager
def alert_sender(outbox_root, log: logging.Logger) -> Iterator[None]:
    """Posts the outbox's messages while the block runs, when PHOTON_ALERT_WEBHOOK names a webhook."""
    webhook = os.environ.get(WEBHOOK_ENV)
    if not webhook:
        yield
        return
    outbox = AlertOutbox(outbox_root)

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(SEND_EVERY_SECONDS):
            try:
                send_due(outbox, webhook, log)
                outbox.forget_old_sent(time.time())
            except Exception:  # noqa: BLE001 - a broken file, a full disk: logged, the next pass goes on
                log.exception("the alert sender's pass failed; the next one goes on")

    thread = threading.Thread(target=loop, name="alert-sender", daemon=True)
    thread.start()
    try:
        yield
    finally:
        # Not waited for past a second: a post under way (up to POST_TIMEOUT_SECONDS) must not eat into the
        # stop's 30 s; its message stays queued (a post that was accepted is sent again at the next start).
        stop.set()
        thread.join(timeout=1.0)

