"""The alert sender against a real local HTTP server: a message is posted once accepted; a webhook that
answers 500 or does not answer in time is tried again after its backoff, and the message stays queued."""

import logging
import time


from photon import alert_sender
from photon.alert_sender import backoff, send_due
from resources.state.alert_outbox import AlertOutbox
from tests.webhook import Webhook, webhook_server

LOG = logging.getLogger("test")
BODY = {"text": "photon: blocking check joined_clicks_unique of joined_clicks failed", "kind": "check_failed",
        "asset": "joined_clicks", "check": "joined_clicks_unique", "run_id": "r1", "url": None}


def test_a_refused_message_is_retried_after_its_backoff_then_sent_once(tmp_path):
    outbox = AlertOutbox(tmp_path)
    assert outbox.put("check_failed:7", BODY)
    assert not outbox.put("check_failed:7", BODY)  # the same event again: nothing more
    with webhook_server(Webhook(statuses=[500])) as hook:
        assert send_due(outbox, hook.url, LOG) == 0
        [pending] = list((tmp_path / "outbox").glob("*.json"))
        assert outbox.due(time.time()) == []  # waiting for its backoff
        assert outbox.due(time.time() + backoff(1)) and backoff(1) == 2.0 and backoff(20) == 300.0
        time.sleep(backoff(1))
        assert send_due(outbox, hook.url, LOG) == 1
        assert send_due(outbox, hook.url, LOG) == 0
    assert [status for status, _ in hook.received] == [500, 200] and hook.accepted() == [BODY]
    assert not pending.exists() and (tmp_path / "sent" / pending.name).exists()
    assert not outbox.put("check_failed:7", BODY)  # sent: a tick run again adds nothing


def test_a_webhook_that_does_not_answer_in_time_is_retried(tmp_path, monkeypatch):
    monkeypatch.setattr(alert_sender, "POST_TIMEOUT_SECONDS", 0.5)
    outbox = AlertOutbox(tmp_path)
    outbox.put("stale:3", {**BODY, "kind": "stale"})
    with webhook_server(Webhook(stall_seconds=2.0)) as hook:
        started = time.monotonic()
        assert send_due(outbox, hook.url, LOG) == 0
        assert time.monotonic() - started < 2.0
        [pending] = outbox.due(time.time() + backoff(1))
        assert pending.attempts == 1
        assert send_due(outbox, hook.url, LOG) == 0  # not due yet
        assert send_due(outbox, "http://127.0.0.1:1/closed", LOG) == 0  # nothing listening: retried too
