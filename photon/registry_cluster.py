"""The replicated registry of a data directory (docs/ARCHITECTURE.md, "The replicated registry"): an
etcd cluster of N members holding the log (Raft), and N replicas (`photon registry serve --replica`)
applying it into DuckDB, each a row of photon/components.py's table, restarted when it exits.

Started by `photon run --registry-replicas N`, `photon up --registry-replicas N` (shared by the
datacenters of that process) and `photon registry serve --replicas N` (once, for processes of one
datacenter each, which get the replicas' addresses in PHOTON_REGISTRY_ADDRESS). With PHOTON_REGISTRY_ETCD
naming an existing cluster (`http://HOST:PORT,...`), only the replicas are started, on it.

Under the data directory:
- `registry/replicated.json`: the configuration, written once: members, ports, the cluster's token,
  and whether a registry of one machine found there was loaded into the log. Its presence also says
  that nothing may open `registry/` as the registry of one machine (resources/registry/api.py);
- `registry/etcd/<member>/`: a member's data;
- `registry/replica-<n>/`: a replica's state (and its ready file while it serves).
A member whose directory is gone (its machine lost) is replaced before it starts again: removed from
the cluster and added anew (`replace_if_wiped`); a replica whose directory is gone rebuilds itself
from a live replica's snapshot. Meanwhile the runs go on against the majority.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import duckdb

from photon.components import COMPONENTS, Launch, local_registry, registry_lock
from photon.deployment import RunnerError
from photon.supervisor import Supervisor
from resources.registry.api import ADDRESS_ENV, REPLICATED_FILE
from resources.registry.etcd_log import Credentials, Etcd, EtcdLog, EtcdUnavailable, parse_endpoints
from resources.registry.log_entries import Entry, Op, split_table
from resources.spark.connect_server import free_port
from resources.state.layout import DataLayout

ETCD_ENV = "PHOTON_REGISTRY_ETCD"
ETCD_START_SECONDS = 30.0  # a majority of members serving within this, or one line and exit 2
REPLICA_START_SECONDS = 300.0  # a replica catching up copies another's state first
SINGLE_FILES = ("meta.duckdb", "work.duckdb", "caps.duckdb")

log = logging.getLogger(__name__)


@dataclass
class ClusterConfig:
    replicas: int
    token: str
    members: list[dict] = field(default_factory=list)  # {"name", "client_port", "peer_port"}
    replica_ports: dict[str, int] = field(default_factory=dict)
    etcd: str | None = None  # an existing cluster's endpoints (PHOTON_REGISTRY_ETCD)
    imported: bool = False  # a registry of one machine found in registry/ was loaded into the log
    created: bool = False  # the members formed their cluster once (a wiped one then joins it anew)
    host: str = "127.0.0.1"

    @staticmethod
    def path(layout: DataLayout) -> Path:
        return layout.registry_dir / REPLICATED_FILE

    @classmethod
    def load(cls, layout: DataLayout) -> "ClusterConfig | None":
        path = cls.path(layout)
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def save(self, layout: DataLayout) -> None:
        path = self.path(layout)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self), indent=2))
        partial.replace(path)

    def endpoints(self) -> list[str]:
        if self.etcd:
            return parse_endpoints(self.etcd)
        return [f"http://{self.host}:{m['client_port']}" for m in self.members]

    def addresses(self) -> list[str]:
        return [f"{self.host}:{port}" for _, port in sorted(self.replica_ports.items())]

    def peers(self) -> str:
        return ",".join(f"{m['name']}=http://{self.host}:{m['peer_port']}" for m in self.members)


def cluster_config(layout: DataLayout, replicas: int, etcd: str | None) -> ClusterConfig:
    """The data directory's configuration, made (and saved) on first use with free ports."""
    config = ClusterConfig.load(layout)
    if config is not None:
        if config.replicas != replicas:
            raise ValueError(f"the registry of {layout.root} has {config.replicas} replicas, not {replicas} "
                             f"({ClusterConfig.path(layout)})")
        return config
    config = ClusterConfig(replicas=replicas, token=f"photon-{secrets.token_hex(6)}", etcd=etcd)
    if not etcd:
        config.members = [{"name": f"etcd-{n}", "client_port": free_port(), "peer_port": free_port()}
                          for n in range(1, replicas + 1)]
    config.replica_ports = {f"replica-{n}": free_port() for n in range(1, replicas + 1)}
    config.save(layout)
    return config


def member_dir(layout: DataLayout, name: str) -> Path:
    return layout.registry_dir / "etcd" / name


def replica_dir(layout: DataLayout, name: str) -> Path:
    return layout.registry_dir / name


def replace_if_wiped(layout: DataLayout, config: ClusterConfig, member: dict, credentials: Credentials) -> None:
    """Before a member starts: if its data directory is gone while its cluster exists, it is removed
    from the cluster and added anew (etcd refuses a member that lost its data under its old
    identity); it then starts with the cluster state "existing" (`member_state`)."""
    if not config.created or member_dir(layout, member["name"]).exists():
        return
    others = [e for e in config.endpoints() if not e.endswith(f":{member['client_port']}")]
    etcd = Etcd(others, credentials)
    peer = f"http://{config.host}:{member['peer_port']}"
    for known in etcd.members():
        if peer in known.get("peerURLs", []):
            etcd.remove_member(known["ID"])
    etcd.add_member(peer)
    log.warning("etcd member %s lost its data: removed from the cluster and added anew", member["name"])


def etcd_launch(layout: DataLayout, config: ClusterConfig, member: dict) -> Launch:
    state = "existing" if config.created else "new"
    return Launch(layout, dict(os.environ), of=member["name"].removeprefix("etcd-"), port=member["client_port"],
                  options={"member": member, "peers": config.peers(), "token": config.token, "host": config.host,
                           "state": state, "dir": member_dir(layout, member["name"])})


def replica_launch(layout: DataLayout, config: ClusterConfig, name: str) -> Launch:
    return Launch(layout, dict(os.environ), of=name.removeprefix("replica-"), port=config.replica_ports[name],
                  options={"endpoints": ",".join(config.endpoints()), "dir": replica_dir(layout, name),
                           "host": config.host, "name": name})


def start_members(supervisor: Supervisor, layout: DataLayout, config: ClusterConfig, credentials: Credentials) -> None:
    """The members started; returns once a majority serves (ValueError, one line, after ETCD_START_SECONDS).
    A member whose directory is gone (its machine lost while nothing restarted it) starts last, once
    the others serve: it is replaced through them."""
    wiped = [m for m in config.members if config.created and not member_dir(layout, m["name"]).exists()]
    for member in [m for m in config.members if m not in wiped] + wiped:
        if member is (wiped or [None])[0]:
            wait_for_etcd(config, credentials, supervisor)
        supervisor.start(COMPONENTS["etcd"].spec(
            etcd_launch(layout, config, member),
            before_start=lambda m=member: replace_if_wiped(layout, config, m, credentials),
            fresh_command=lambda m=member: COMPONENTS["etcd"].command(etcd_launch(layout, config, m))))
    wait_for_etcd(config, credentials, supervisor)
    if not config.created:
        config.created = True
        config.save(layout)


def wait_for_etcd(config: ClusterConfig, credentials: Credentials, supervisor: Supervisor | None = None) -> None:
    etcd = Etcd(config.endpoints(), credentials)
    deadline = time.monotonic() + ETCD_START_SECONDS
    while True:
        if supervisor is not None:
            supervisor.watch()
        try:
            etcd.request("/kv/range", {"key": "AA==", "count_only": True}, deadline_seconds=1.0)
            return
        except EtcdUnavailable:
            if time.monotonic() > deadline:
                hosts = ",".join(e.split("://", 1)[1] for e in config.endpoints())
                raise ValueError(f"etcd at {hosts} unreachable") from None


def start_replicas(supervisor: Supervisor, layout: DataLayout, config: ClusterConfig) -> None:
    for name in sorted(config.replica_ports):
        ready = replica_dir(layout, name) / "ready"
        supervisor.start(COMPONENTS["registry-replica"].spec(
            replica_launch(layout, config, name), before_start=lambda ready=ready: ready.unlink(missing_ok=True)))
    for name in sorted(config.replica_ports):
        supervisor.wait_ready(f"registry-{name}")


@contextmanager
def replicated_registry(supervisor: Supervisor, layout: DataLayout, replicas: int) -> Iterator[list[str]]:
    """The data directory's replicated registry, started (members, then replicas) for as long as this
    process, with PHOTON_REGISTRY_ADDRESS set to its replicas meanwhile; yields their addresses.
    The supervisor restarts each member and replica that exits, and stops them last."""
    if replicas < 1:
        raise ValueError(f"--registry-replicas must be at least 1, got {replicas}")
    lock_path = registry_lock(layout)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    credentials = Credentials.from_env(os.environ)
    with open(lock_path, "a") as owner:
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunnerError(f"the registry of {layout.root} is served by another process; to run datacenters "
                              f"in separate processes, start `photon registry serve --data-dir {layout.root} "
                              f"--replicas {replicas}` once and set {ADDRESS_ENV} for each") from None
        config = cluster_config(layout, replicas, os.environ.get(ETCD_ENV) or None)
        if config.etcd:
            wait_for_etcd(config, credentials)
        else:
            start_members(supervisor, layout, config, credentials)
        import_single_registry(layout, config, credentials)
        start_replicas(supervisor, layout, config)
        addresses = config.addresses()
        supervisor.log.info("registry replicas at %s (etcd at %s)", ",".join(addresses), ",".join(config.endpoints()))
        previous = os.environ.get(ADDRESS_ENV)
        os.environ[ADDRESS_ENV] = ",".join(addresses)
        try:
            yield addresses
        finally:
            if previous is None:
                os.environ.pop(ADDRESS_ENV, None)
            else:
                os.environ[ADDRESS_ENV] = previous


def import_single_registry(layout: DataLayout, config: ClusterConfig, credentials: Credentials) -> None:
    """A registry of one machine found in `registry/` (its shard, meta, work and caps files) loaded into
    the log once, its files then moved to `registry/single-imported/`. Each op's request id names what
    it loads, so an import cut short and done again applies nothing twice."""
    directory = layout.registry_dir
    shards = sorted(directory.glob("shard-*.duckdb"))
    if config.imported or not (shards or (directory / "meta.duckdb").exists()):
        if not config.imported:
            config.imported = True
            config.save(layout)
        return
    etcd_log = EtcdLog(Etcd(config.endpoints(), credentials))
    ops = list(single_registry_ops(directory, shards))
    for n, op in enumerate(ops):
        etcd_log.append("import", Entry("import", time.time_ns() // 1000, [op]).encode(), deadline_seconds=60.0)
        if n % 50 == 0:
            log.info("loading the registry of one machine into the log: %d of %d entries", n + 1, len(ops))
    moved = directory / "single-imported"
    moved.mkdir(exist_ok=True)
    for path in [*shards, *(directory / name for name in SINGLE_FILES)]:
        for part in (path, path.with_name(path.name + ".wal")):
            if part.exists():
                part.replace(moved / part.name)
    config.imported = True
    config.save(layout)
    log.warning("the registry of one machine in %s was loaded into the replicated log (%d entries); its files "
                "are in %s", directory, len(ops), moved)


def single_registry_ops(directory: Path, shards: list[Path]) -> Iterator[Op]:
    """The `import` ops of a registry of one machine: its shard configuration, each shard's ids (in
    slices that fit an entry) and GC boundary, its work claims and click-cap grants."""
    with duckdb.connect(str(directory / "meta.duckdb"), read_only=True) as meta:
        rows = meta.sql("SELECT start_us, end_us, shards FROM shard_config ORDER BY start_us").fetchall()
    yield Op("import", "import.shard_config", {"what": "shard_config", "rows": [list(r) for r in rows]})
    for path in shards:
        with duckdb.connect(str(path), read_only=True) as shard:
            ids = shard.sql("SELECT click_id, timestamp_us, token FROM registered_ids ORDER BY click_id").to_arrow_table()
            boundary = shard.sql("SELECT boundary_us FROM gc_boundary").fetchall()[0][0]
        index = int(path.stem.split("-")[1])
        for n, part in enumerate(split_table(ids)):
            yield Op("import", f"import.{path.stem}.{n}", {"what": "ids"}, part)
        yield Op("import", f"import.{path.stem}.boundary", {"what": "boundaries", "boundaries": {str(index): boundary}})
    for name, table in (("work.duckdb", "claims"), ("caps.duckdb", "grants")):
        if (directory / name).exists():
            with duckdb.connect(str(directory / name), read_only=True) as con:
                rows = con.sql(f"SELECT * FROM {table}").to_arrow_table()
            for n, part in enumerate(split_table(rows)):
                yield Op("import", f"import.{table}.{n}", {"what": table}, part)


@contextmanager
def registry_for(supervisor: Supervisor, layout: DataLayout, replicas: int | None) -> Iterator[None]:
    """The registry a deployment uses: the one PHOTON_REGISTRY_ADDRESS names; else the replicated
    registry (`replicas`, or the one the data directory has: it is kept for the next run); else the
    registry of one machine, started for this process (photon/components.py: local_registry)."""
    if os.environ.get(ADDRESS_ENV):
        yield
        return
    configured = ClusterConfig.load(layout)
    replicas = replicas or (configured.replicas if configured else None)
    if replicas:
        with replicated_registry(supervisor, layout, replicas):
            yield
        return
    with local_registry(supervisor, layout):
        yield


def serve_cluster(layout: DataLayout, replicas: int) -> int:
    """`photon registry serve --replicas N`: the replicated registry of the data directory, kept until
    SIGTERM or SIGINT; prints its replicas' addresses once they serve."""
    import signal

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: stopping.append(received))
    with Supervisor(log) as supervisor, replicated_registry(supervisor, layout, replicas) as addresses:
        print(f"photon registry: replicas at {','.join(addresses)}; set {ADDRESS_ENV} to that for each run",
              flush=True)
        while not stopping:
            supervisor.watch()
            time.sleep(0.5)
    return 0
