"""`photon gen`, `photon replicate`, `photon run`, `photon up`, `photon check`, `photon spark-connect`, `photon registry` (docs/CONTRACTS.md: command line).
Errors are one line and exit non-zero."""

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from photon import gen
from resources.state.layout import DataLayout


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"photon: error: {message}\n")


def add_spark_remote(command: argparse.ArgumentParser) -> None:
    command.add_argument("--spark-remote", metavar="sc://HOST:PORT",
                         help="run Spark on this Spark Connect server (default: env PHOTON_SPARK_REMOTE, else an"
                              " in-process local session)")


def parser() -> argparse.ArgumentParser:
    top = OneLineParser(prog="photon", description="Exactly-once joining of query and click logs.")
    commands = top.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    add_data_commands(commands)
    add_pipeline_commands(commands)
    add_service_commands(commands)
    return top


def add_registry_command(commands) -> None:
    """`photon registry serve | stats | reshard` (the shared secret: env PHOTON_REGISTRY_SECRET)."""
    registry = commands.add_parser("registry", help="the IdRegistry service (shared secret: env PHOTON_REGISTRY_SECRET)")
    actions = registry.add_subparsers(dest="registry_command", required=True, parser_class=OneLineParser)
    serve = actions.add_parser("serve", help="serve the registry under DIR/registry until SIGTERM/SIGINT: the "
                               "registry of one machine; one replica of the replicated registry (--replica); or a "
                               "whole replicated registry, etcd members and replicas (--replicas)")
    for flag, options in (
        ("--data-dir", {"required": True, "type": Path}),
        ("--host", {"default": "127.0.0.1"}),
        ("--port", {"type": int, "help": "0 picks a free port (see --ready-file); required but with --replicas"}),
        ("--shards", {"type": int, "default": 1, "help": "initial shard count of a new registry"}),
        ("--gc-threshold-days", {"type": float, "default": 3.0}),
        ("--ready-file", {"type": Path, "help": "write the bound HOST:PORT here once serving"}),
        ("--replica", {"help": "serve this replica of the replicated registry (state in DIR/registry/NAME)"}),
        ("--etcd", {"help": "the etcd cluster of --replica: http://HOST:PORT,... (default: env PHOTON_REGISTRY_ETCD)"}),
        ("--replicas", {"type": int, "help": "start and keep a replicated registry of N etcd members and N replicas "
                        "under DIR/registry (with PHOTON_REGISTRY_ETCD, replicas only, on that cluster)"}),
    ):
        serve.add_argument(flag, **options)
    stats = actions.add_parser("stats", help="print the server's counters and shard configuration as JSON")
    stats.add_argument("--address", required=True, help="HOST:PORT (a replica's, for the replicated registry)")
    reshard = actions.add_parser("reshard", help="use N shards for ids from a future time on")
    reshard.add_argument("--address", required=True, help="HOST:PORT[,HOST:PORT...]")
    reshard.add_argument("--shards", required=True, type=int)
    reshard.add_argument("--effective-at-us", type=int, help="default: now + the server's max clock skew")


def add_registry_replicas(command: argparse.ArgumentParser) -> None:
    command.add_argument("--registry-replicas", type=int, help="the replicated registry: a local etcd cluster of N "
                         "members and N replicas under DIR/registry, kept for the next run (default: the one DIR "
                         "has, else the registry of one machine)")


def add_data_commands(commands) -> None:
    """`gen` and `replicate`: the logs a pipeline reads."""
    g = commands.add_parser("gen", help="write a synthetic workload of query and click logs")
    g.add_argument("--data-dir", required=True, type=Path)
    gen.add_arguments(g)

    rp = commands.add_parser("replicate", help="bring a lagging replica up to date from another one")
    rp.add_argument("--data-dir", required=True, type=Path)
    rp.add_argument("--to", required=True, dest="to_dc", metavar="DC", help="the replica to extend")
    rp.add_argument("--from", dest="from_dc", metavar="DC",
                    help="the source replica (default: the first datacenter of DIR/gen_summary.json)")
    rp.add_argument("--lag-seconds", type=float, default=0.0,
                    help="copy only lines up to the source's newest event time minus this"
                         " (default: 0, every complete line)")


def add_pipeline_commands(commands) -> None:
    """`run`, `up` and `check`: the pipeline, headless or as a deployment, and its checks."""
    r = commands.add_parser("run", help="run the sensor-driven pipeline headlessly")
    r.add_argument("--data-dir", required=True, type=Path)
    r.add_argument("--until-idle", action="store_true", required=True,
                   help="run until every complete log byte is consumed and no pending click can be joined")
    r.add_argument("--datacenters", help="comma-separated replicas under logs/ (default: all of them)")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object, last line")
    r.add_argument("--timeout-seconds", type=float, default=3600.0, help="give up (state kept) after this long")
    r.add_argument("--min-seconds", type=float, default=0.0,
                   help="keep tailing the logs at least this long before idle counts (logs still being written)")
    r.add_argument("--verbose", action="store_true", help="log every tick and run event")
    add_spark_remote(r)
    add_registry_replicas(r)

    u = commands.add_parser("up", help="the whole deployment on DIR until SIGINT/SIGTERM: registry service, Spark"
                                        " Connect server, dagster-daemon with the dispatchers running, dagster-webserver")
    u.add_argument("--data-dir", required=True, type=Path)
    u.add_argument("--port", type=int, default=3000, help="the UI's port")
    u.add_argument("--datacenters", help="comma-separated replicas under logs/ (default: all of them)")
    u.add_argument("--spark-master", default="local[2]",
                   help="the Connect server's master: local[N], or spark://HOST:PORT of a standalone cluster")
    u.add_argument("--verbose", action="store_true", help="log more of each component")
    add_registry_replicas(u)

    c = commands.add_parser("check", help="run every asset check against a data directory, recorded in its"
                                          " Dagster instance")
    c.add_argument("--data-dir", required=True, type=Path)
    c.add_argument("--datacenters", help="comma-separated replicas whose photon run must not be running, locked"
                                         " during the checks (default: all of them)")
    c.add_argument("--json", action="store_true", help="print the outcome as one JSON object, last line")
    c.add_argument("--verbose", action="store_true", help="log every run event")


def add_service_commands(commands) -> None:
    """`spark-connect`, `registry` and `event-store`: the long-lived services the deployments start."""
    sc = commands.add_parser("spark-connect", help="serve a Spark Connect server with Delta until SIGTERM/SIGINT"
                                                   " (for --spark-remote / PHOTON_SPARK_REMOTE)")
    sc.add_argument("--port", type=int, default=15002)
    sc.add_argument("--host", default="127.0.0.1")
    sc.add_argument("--master", default="local[2]", help="local[N], or spark://HOST:PORT of a standalone cluster")
    sc.add_argument("--driver-memory", help="the JVM heap (default: resources/spark/session.py DRIVER_MEMORY, 2g)")

    add_registry_command(commands)
    es = commands.add_parser("event-store", help="the EventStore's long-lived parts")
    es_actions = es.add_subparsers(dest="event_store_command", required=True, parser_class=OneLineParser)
    t = es_actions.add_parser("tail", help="feed a datacenter's memory tier in the registry service from its "
                              "query logs as they are written, until SIGTERM/SIGINT (photon run and photon up "
                              "start one per datacenter)")
    t.add_argument("--data-dir", required=True, type=Path)
    t.add_argument("--datacenter", required=True)
    t.add_argument("--address", help="HOST:PORT of the registry service (default: env PHOTON_REGISTRY_ADDRESS)")
    t.add_argument("--settings", help="the settings it goes by, as JSON (photon/query_tail.py: TailSettings; "
                   "default: from the pipeline settings, PHOTON_SETTINGS)")


def command_gen(args) -> int:
    config = gen.config_from_args(args)
    summary = gen.generate(args.data_dir, config)
    keys = ("query_events", "click_lines", "distinct_click_ids", "duplicate_click_lines", "orphan_clicks",
            "late_query_events", "bad_lines", "torn_lines")
    print(" ".join(f"{k}={summary[k]}" for k in keys if k in summary))
    return 0


def command_replicate(args) -> int:
    from photon.replication import newest_event_us, replicate

    source_dc = args.from_dc or recorded_source(args.data_dir)
    for dc in (source_dc, args.to_dc):
        gen.check_datacenter_name(dc)
    if source_dc == args.to_dc:
        raise ValueError(f"--from and --to are both {source_dc}")
    if not 0 <= args.lag_seconds < float("inf"):
        raise ValueError(f"--lag-seconds must be a number of seconds >= 0, got {args.lag_seconds}")
    logs = DataLayout(args.data_dir).logs
    cutoff_us = None
    if args.lag_seconds > 0:
        newest = newest_event_us(logs / source_dc)
        cutoff_us = None if newest is None else newest - round(args.lag_seconds * 1e6)
    stats = replicate(logs / source_dc, logs / args.to_dc, cutoff_us)
    print(f"files_created={stats.files_created} files_extended={stats.files_extended}"
          f" bytes_appended={stats.bytes_appended} lines_appended={stats.lines_appended}")
    return 0


def recorded_source(data_dir: Path) -> str:
    """The source replica of a generated workload: its first datacenter."""
    path = data_dir / gen.SUMMARY_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))["config"]["datacenters"][0]
    except FileNotFoundError:
        raise ValueError(f"no {path} to name the source replica; give --from") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"{path} does not name the datacenters; give --from") from None


def choose_datacenters(layout: DataLayout, option: str | None) -> list[str]:
    available = layout.datacenters()
    if option is None:
        if not available:
            raise ValueError(f"no datacenter directories under {layout.logs}")
        return available
    chosen = [dc.strip() for dc in option.split(",") if dc.strip()]
    unknown = sorted(set(chosen) - set(available))
    if not chosen or unknown:
        named = ", ".join(unknown) if unknown else repr(option)
        raise ValueError(f"--datacenters: unknown datacenter(s) {named} under {layout.logs}")
    return chosen


def console_log(verbose: bool, quiet: tuple[str, ...]) -> logging.Logger:
    """The command's log on stderr; unless `verbose`, the `quiet` loggers only warn."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if not verbose:
        for noisy in quiet:
            logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger("photon")


def use_spark_remote(option: str | None) -> None:
    """--spark-remote: every Spark session of this process and its runs is a client of that server."""
    from resources.spark.session import SPARK_REMOTE_ENV

    if option is None:
        return
    if not option.startswith("sc://"):
        raise ValueError(f"--spark-remote {option!r} is not a Spark Connect address (sc://HOST:PORT)")
    os.environ[SPARK_REMOTE_ENV] = option


def command_run(args) -> int:
    from photon.deployment import RunnerError, Stopped
    from photon.runner import RunOptions, run_until_idle

    use_spark_remote(args.spark_remote)
    if not args.data_dir.is_dir():
        raise ValueError(f"data directory {args.data_dir} does not exist")
    layout = DataLayout(args.data_dir.resolve())
    datacenters = choose_datacenters(layout, args.datacenters)
    log = console_log(args.verbose, ("photon.sensors", "dagster", "py4j", "alembic"))
    try:
        summary = run_until_idle(layout, datacenters, log, RunOptions(
            args.timeout_seconds, run_log_level="DEBUG" if args.verbose else "WARNING", min_seconds=args.min_seconds,
            registry_replicas=args.registry_replicas, progress=not args.json))
    except RunnerError as error:
        print(f"photon: error: {error}", file=sys.stderr)
        return 130 if isinstance(error, Stopped) else 1  # 130: a shell's status for an interrupted command
    except KeyboardInterrupt:  # a second signal (resources/runtime/stop_signal.py)
        print("photon: error: stopped at once by a second signal; state is kept, run again to continue", file=sys.stderr)
        return 130
    failed_checks = sorted(name for name, passed in summary["verification"].items() if not passed)
    for key, value in summary.items():
        print(f"{key}: {value}")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    if failed_checks or summary["failed_work_units"]:
        print(f"photon: error: checks failed: {failed_checks}; work units failed for good: "
              f"{summary['failed_work_units']}", file=sys.stderr)
        return 1
    return 0


def command_up(args) -> int:
    from photon.deployment import RunnerError
    from photon.up import bring_up

    if not args.data_dir.is_dir():
        raise ValueError(f"data directory {args.data_dir} does not exist")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port} is not a port number")
    layout = DataLayout(args.data_dir.resolve())
    datacenters = choose_datacenters(layout, args.datacenters)
    log = console_log(args.verbose, ("dagster", "py4j", "alembic"))
    try:
        return bring_up(layout, datacenters, args.port, args.spark_master, log,
                        registry_replicas=args.registry_replicas)
    except RunnerError as error:
        print(f"photon: error: {error}", file=sys.stderr)
        return 1


def command_check(args) -> int:
    from photon.check import ensure_checkable, report, run_checks
    from photon.deployment import DeploymentRunning, RunnerError

    layout = DataLayout(args.data_dir.resolve())
    ensure_checkable(layout)
    datacenters = choose_datacenters(layout, args.datacenters)
    log = console_log(args.verbose, ("photon", "dagster", "py4j", "alembic"))
    try:
        checks, run_id = run_checks(layout, datacenters, log, run_log_level="DEBUG" if args.verbose else "CRITICAL")
    except DeploymentRunning as error:
        # A check would need the deployment's locks and registry; the deployment checks itself.
        print(f"photon: error: {error}: it runs these checks itself (the check_tables job, every "
              "table_checks_every_seconds and when idle; see its UI), or stop it to run photon check", file=sys.stderr)
        return 1
    except RunnerError as error:
        print(f"photon: error: {error}", file=sys.stderr)
        return 1
    return report(checks, run_id, args.json, sys.stdout, sys.stderr)


def command_spark_connect(args) -> int:
    from resources.spark.connect_server import server_command, server_environment

    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port} is not a port number")
    memory = {"driver_memory": args.driver_memory} if args.driver_memory else {}
    command = server_command(args.port, master=args.master, host=args.host, **memory)
    sys.stdout.flush()
    os.execve(command[0], command, server_environment(args.host))


def command_event_store(args) -> int:
    from photon.query_tail import TailSettings, tail_forever
    from resources.registry.api import ADDRESS_ENV, SECRET_ENV
    from resources.registry.client import RemoteIdRegistry

    if args.settings:
        settings = TailSettings(**json.loads(args.settings))
    else:
        from resources.settings import pipeline_settings

        settings = TailSettings.of(pipeline_settings())
    address = args.address or os.environ.get(ADDRESS_ENV)
    if not address:
        raise ValueError(f"the registry service's address is needed: --address or {ADDRESS_ENV}")
    layout = DataLayout(args.data_dir.resolve())
    if not (layout.logs / args.datacenter).is_dir():
        raise ValueError(f"no datacenter {args.datacenter} under {layout.logs}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    registry = RemoteIdRegistry(address, os.environ.get(SECRET_ENV) or None)
    try:
        tail_forever(layout, args.datacenter, registry, settings)
    finally:
        registry.close()
    return 0


def serve_registry(args, secret: str | None) -> int:
    """`photon registry serve`, in one of its three forms (see its help)."""
    from resources.registry.etcd_log import Credentials, parse_endpoints
    from resources.registry.service import ReplicaServing, serve, serve_replica

    if args.replicas is not None:
        from photon.registry_cluster import serve_cluster

        return serve_cluster(DataLayout(args.data_dir.resolve()), args.replicas)
    if args.port is None or not 0 <= args.port < 65536:
        raise ValueError(f"--port {args.port} is not a port number")
    if args.shards < 1:
        raise ValueError(f"--shards must be at least 1, got {args.shards}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.replica:
        endpoints = args.etcd or os.environ.get("PHOTON_REGISTRY_ETCD")
        if not endpoints:
            raise ValueError("--replica needs the etcd cluster: --etcd or PHOTON_REGISTRY_ETCD")
        layout = DataLayout(args.data_dir.resolve())
        serving_at = ReplicaServing(parse_endpoints(endpoints), args.host, args.port, secret, args.ready_file,
                                    Credentials.from_env(os.environ))
        serve_replica(args.replica, layout.registry_dir / args.replica, serving_at, args.gc_threshold_days)
        return 0
    serve(args.data_dir, args.host, args.port, args.shards, args.gc_threshold_days, secret, args.ready_file)
    return 0


def command_registry(args) -> int:
    from resources.registry.api import SECRET_ENV
    from resources.registry.client import RemoteIdRegistry

    secret = os.environ.get(SECRET_ENV) or None
    if args.registry_command == "serve":
        return serve_registry(args, secret)
    # The one-line error below is the report; per-attempt retry warnings would only repeat it.
    logging.getLogger("resources.registry.client").setLevel(logging.ERROR)
    registry = RemoteIdRegistry(args.address, secret, timeout_seconds=10, max_attempts=3)
    try:
        if args.registry_command == "stats":
            print(json.dumps(registry.stats(), indent=2, sort_keys=True))
        else:
            print(json.dumps(registry.reshard(args.shards, args.effective_at_us), indent=2))
    except (ConnectionError, PermissionError) as error:
        print(f"photon: error: {error}", file=sys.stderr)
        return 1
    finally:
        registry.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        commands = {"gen": command_gen, "replicate": command_replicate, "run": command_run, "up": command_up,
                    "check": command_check, "spark-connect": command_spark_connect, "registry": command_registry,
                    "event-store": command_event_store}
        return commands[args.command](args)
    except ValueError as error:
        print(f"photon: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
