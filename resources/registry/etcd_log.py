"""The replicated registry's log on etcd (a Raft-replicated key-value store), through its JSON gateway
with the `etcd3gw` client, over every member's endpoint.

Keys (docs/ARCHITECTURE.md, "The replicated registry"):
- `/photon/registry/log/<proposer>/<n>`: one log entry each (resources/registry/log_entries.py). The
  etcd revision of its put is its place in the log: every replica applies entries in revision order.
  A put returns once a majority of the members holds it.
- `/photon/registry/trimmed`: the revision up to which entries were deleted (every live replica had
  applied them), written in the same transaction as their deletion. A replica behind it has missed
  entries for good: it loads a snapshot of a live replica instead of applying the log.
- `/photon/registry/replicas/<name>`: each live replica's address and applied revision, under an
  etcd lease of its own: a replica that dies drops out within the lease's TTL.

Reading the log is one linearizable range request (a quorum read) of the entries after a revision,
sorted by revision, with the trimmed revision in the same transaction: a replica that has applied
everything it returned is at the log's head as of that request.

A request that fails on one endpoint (refused, timed out, no leader) goes to the next, until its
deadline; then `EtcdUnavailable`. Off loopback, clients authenticate (etcd's users: `user`,
`password`) or present client certificates (`ca`, `cert`, `key`); see `Credentials`.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

from etcd3gw import exceptions as etcd_errors
from etcd3gw.client import Etcd3Client

log = logging.getLogger(__name__)

LOG_PREFIX = b"/photon/registry/log/"
TRIMMED_KEY = b"/photon/registry/trimmed"
REPLICAS_PREFIX = b"/photon/registry/replicas/"
REQUEST_SECONDS = 5.0  # one request to one member
# etcd answers a write it cannot commit (no leader, no majority) with these after its own timeout.
NOT_COMMITTED = ("etcdserver: request timed out", "etcdserver: leader changed", "etcdserver: no leader",
                 "etcdserver: too many requests", "etcdserver: server stopped")


REFUSED = ("permission denied", "user name is empty", "authentication failed", "user name not found")


def error_text(error: Exception) -> str:
    return str(getattr(error, "detail_text", None) or error)


class EtcdUnavailable(ConnectionError):
    """No member answered (or none could commit) within the deadline: a majority is gone or unreachable."""


class EtcdRefused(PermissionError):
    """The cluster refused the credentials (or their absence)."""


@dataclass(frozen=True)
class Credentials:
    """How this process authenticates to etcd: a user and password (etcd's auth), client
    certificates over https, or both. From the environment: PHOTON_REGISTRY_ETCD_USER,
    PHOTON_REGISTRY_ETCD_PASSWORD, PHOTON_REGISTRY_ETCD_CA, PHOTON_REGISTRY_ETCD_CERT,
    PHOTON_REGISTRY_ETCD_KEY."""

    user: str | None = None
    password: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_env(cls, env: dict) -> "Credentials":
        return cls(*(env.get(f"PHOTON_REGISTRY_ETCD_{name}") or None for name in ("USER", "PASSWORD", "CA", "CERT", "KEY")))


def prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def parse_endpoints(text: str) -> list[str]:
    """`http://HOST:PORT,...` (a bare HOST:PORT means http)."""
    endpoints = [e.strip() if "://" in e else f"http://{e.strip()}" for e in text.split(",") if e.strip()]
    if not endpoints:
        raise ValueError("no etcd endpoint given")
    for endpoint in endpoints:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.hostname or not parsed.port:
            raise ValueError(f"etcd endpoint {endpoint!r} is not http(s)://HOST:PORT")
    return endpoints


class Etcd:
    """The cluster at `endpoints`, one etcd3gw client per endpoint; thread-safe (a client per thread
    and endpoint: requests' sessions are not shared across threads)."""

    def __init__(self, endpoints: list[str], credentials: Credentials = Credentials(),
                 request_seconds: float = REQUEST_SECONDS):
        self.endpoints = list(endpoints)
        self.credentials = credentials
        self.request_seconds = request_seconds
        self._local = threading.local()
        self._preferred = 0
        self._token: str | None = None
        self._token_lock = threading.Lock()

    def _client(self, endpoint: str) -> Etcd3Client:
        clients = self._local.__dict__.setdefault("clients", {})
        if endpoint not in clients:
            parsed = urlparse(endpoint)
            clients[endpoint] = Etcd3Client(host=parsed.hostname, port=parsed.port, protocol=parsed.scheme,
                                            ca_cert=self.credentials.ca, cert_key=self.credentials.key,
                                            cert_cert=self.credentials.cert, timeout=self.request_seconds,
                                            api_path="/v3/")
        return clients[endpoint]

    def _authenticate(self, client: Etcd3Client) -> None:
        with self._token_lock:
            answer = client.post(client.get_url("/auth/authenticate"),
                                 json={"name": self.credentials.user, "password": self.credentials.password})
            self._token = answer["token"]

    def request(self, path: str, body: dict, deadline_seconds: float | None = None, endpoint: str | None = None) -> dict:
        """POSTs `body` to `path` (e.g. "/kv/put") on a member, the next one on failure, until the
        deadline (default: one round of the members); EtcdUnavailable if none answered."""
        deadline = time.monotonic() + (deadline_seconds if deadline_seconds is not None
                                       else self.request_seconds * len(self.endpoints))
        order = [endpoint] if endpoint else self.endpoints[self._preferred:] + self.endpoints[:self._preferred]
        last: Exception | None = None
        while True:
            for at in order:
                client = self._client(at)
                try:
                    if self.credentials.user and self._token is None:
                        self._authenticate(client)
                    headers = {"Authorization": self._token} if self._token else {}
                    answer = client.post(client.get_url(path), json=body, headers=headers)
                    if endpoint is None:
                        self._preferred = self.endpoints.index(at)
                    return answer
                except etcd_errors.Etcd3Exception as error:
                    text = error_text(error)
                    if "invalid auth token" in text and self.credentials.user:
                        self._token = None
                        last = error
                        continue
                    if any(reason in text for reason in REFUSED):
                        raise EtcdRefused(f"etcd at {at} refused the request: {first_line(text)}") from None
                    if isinstance(error, (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError)) \
                            or any(reason in text for reason in NOT_COMMITTED):
                        last = error
                        continue
                    raise
            if time.monotonic() >= deadline:
                where = endpoint or ",".join(self.endpoints)
                raise EtcdUnavailable(f"etcd at {where} unreachable: {first_line(error_text(last) if last else '')}")
            time.sleep(0.2)

    # The key-value calls the registry uses.
    def put(self, key: bytes, value: bytes, lease: int | None = None, deadline_seconds: float | None = None) -> int:
        body = {"key": b64(key), "value": b64(value), **({"lease": lease} if lease else {})}
        return int(self.request("/kv/put", body, deadline_seconds)["header"]["revision"])

    def get(self, key: bytes) -> tuple[bytes | None, int]:
        """The key's value (None: absent) and the cluster's revision, by a linearizable read."""
        answer = self.request("/kv/range", {"key": b64(key)})
        kvs = answer.get("kvs") or []
        return (unb64(kvs[0].get("value")) if kvs else None), int(answer["header"]["revision"])

    def grant_lease(self, ttl_seconds: int) -> int:
        return int(self.request("/lease/grant", {"TTL": ttl_seconds})["ID"])

    def keep_alive(self, lease: int) -> bool:
        """Renews the lease; False if it expired meanwhile."""
        answer = self.request("/lease/keepalive", {"ID": lease})
        return int((answer.get("result") or {}).get("TTL", 0)) > 0

    def compact(self, revision: int) -> None:
        try:
            self.request("/kv/compaction", {"revision": revision, "physical": False})
        except etcd_errors.Etcd3Exception as error:  # compacted there already: nothing to do
            if "compacted" not in error_text(error):
                raise

    def defragment(self) -> None:
        for endpoint in self.endpoints:
            try:
                self.request("/maintenance/defragment", {}, endpoint=endpoint, deadline_seconds=30.0)
            except EtcdUnavailable as error:
                log.info("defragmentation of %s skipped: %s", endpoint, error)

    def members(self) -> list[dict]:
        return self.request("/cluster/member/list", {}).get("members", [])

    def add_member(self, peer_url: str) -> dict:
        return self.request("/cluster/member/add", {"peerURLs": [peer_url]})

    def remove_member(self, member_id: str) -> None:
        self.request("/cluster/member/remove", {"ID": member_id})

    def healthy(self, endpoint: str) -> bool:
        """Whether the member at `endpoint` serves linearizable reads (it has a leader and a majority)."""
        try:
            self.request("/kv/range", {"key": b64(TRIMMED_KEY), "count_only": True}, endpoint=endpoint,
                         deadline_seconds=0.0)
            return True
        except (EtcdUnavailable, etcd_errors.Etcd3Exception):
            return False


def first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else "no answer"


class EtcdLog:
    """The registry's log, its trimmed revision and its replicas' publications, on `etcd`."""

    def __init__(self, etcd: Etcd):
        self.etcd = etcd

    def append(self, proposer: str, value: bytes, deadline_seconds: float) -> int:
        """Puts one entry; returns its revision once a majority holds it (EtcdUnavailable past the
        deadline: it may still be committed later, which its ops' request ids make harmless)."""
        key = LOG_PREFIX + f"{proposer}/{uuid.uuid4().hex}".encode()
        return self.etcd.put(key, value, deadline_seconds=deadline_seconds)

    def read_after(self, revision: int, limit: int = 16, before: int | None = None
                   ) -> tuple[list[tuple[int, bytes]], int, int]:
        """The entries put after `revision` (and before revision `before`, if given; at most `limit`,
        in revision order), the trimmed revision and the cluster's revision, from one linearizable
        transaction."""
        entries = {"key": b64(LOG_PREFIX), "range_end": b64(prefix_end(LOG_PREFIX)), "min_mod_revision": revision + 1,
                   "sort_order": 1, "sort_target": 3, "limit": limit}  # ASCEND by MOD revision
        if before is not None:
            entries["max_mod_revision"] = before - 1
        answer = self.etcd.request("/kv/txn", {"success": [{"request_range": entries},
                                                           {"request_range": {"key": b64(TRIMMED_KEY)}}]})
        ranges = [r["response_range"] for r in answer["responses"]]
        found = [(int(kv["mod_revision"]), unb64(kv.get("value"))) for kv in ranges[0].get("kvs") or []]
        trimmed = ranges[1].get("kvs") or []
        return found, int(unb64(trimmed[0].get("value")) or 0) if trimmed else 0, int(answer["header"]["revision"])

    def trimmed(self) -> int:
        value, _ = self.etcd.get(TRIMMED_KEY)
        return int(value or 0)

    def is_empty(self) -> bool:
        """No entry was ever put (nothing in the log, nothing trimmed)."""
        entries, trimmed, _ = self.read_after(0, limit=1)
        return not entries and trimmed == 0

    def trim(self, boundary: int) -> int:
        """Deletes the entries at or below `boundary` (every live replica applied them), records the
        boundary in the same transaction, and compacts etcd's history there; returns how many."""
        listed = self.etcd.request("/kv/range", {"key": b64(LOG_PREFIX), "range_end": b64(prefix_end(LOG_PREFIX)),
                                                 "max_mod_revision": boundary, "keys_only": True})
        keys = [kv["key"] for kv in listed.get("kvs") or []]
        for start in range(0, max(len(keys), 1), 100):  # etcd allows 128 operations a transaction
            chunk = keys[start:start + 100]
            ops = [{"request_delete_range": {"key": key}} for key in chunk]
            if start + 100 >= len(keys):
                ops.append({"request_put": {"key": b64(TRIMMED_KEY), "value": b64(str(boundary).encode())}})
            self.etcd.request("/kv/txn", {"success": ops})
        self.etcd.compact(boundary)
        return len(keys)

    def publish(self, name: str, value: bytes, lease: int) -> None:
        self.etcd.put(REPLICAS_PREFIX + name.encode(), value, lease=lease)

    def replicas(self) -> dict[str, bytes]:
        answer = self.etcd.request("/kv/range", {"key": b64(REPLICAS_PREFIX), "range_end": b64(prefix_end(REPLICAS_PREFIX))})
        return {unb64(kv["key"])[len(REPLICAS_PREFIX):].decode(): unb64(kv.get("value")) for kv in answer.get("kvs") or []}
