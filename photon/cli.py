"""`photon gen` and `photon run` (DESIGN.md: command line). Errors are one line and exit non-zero."""

import argparse
import json
import logging
import sys
from pathlib import Path

from photon import gen
from photon.layout import DataLayout


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"photon: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    top = OneLineParser(prog="photon", description="Exactly-once joining of query and click logs.")
    commands = top.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    g = commands.add_parser("gen", help="write a synthetic workload of query and click logs")
    g.add_argument("--data-dir", required=True, type=Path)
    gen.add_arguments(g)

    r = commands.add_parser("run", help="run the sensor-driven pipeline headlessly")
    r.add_argument("--data-dir", required=True, type=Path)
    r.add_argument("--until-idle", action="store_true", required=True,
                   help="run until every complete log byte is consumed and no pending click can be joined")
    r.add_argument("--datacenters", help="comma-separated replicas under logs/ (default: all of them)")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object, last line")
    r.add_argument("--timeout-seconds", type=float, default=3600.0, help="give up (state kept) after this long")
    r.add_argument("--verbose", action="store_true", help="log every tick and run event")
    return top


def command_gen(args) -> int:
    config = gen.config_from_args(args)
    summary = gen.generate(args.data_dir, config)
    keys = ("query_events", "click_lines", "distinct_click_ids", "duplicate_click_lines", "orphan_clicks",
            "late_query_events", "bad_lines", "torn_lines")
    print(" ".join(f"{k}={summary[k]}" for k in keys if k in summary))
    return 0


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


def command_run(args) -> int:
    from photon.runner import RunnerError, run_until_idle

    if not args.data_dir.is_dir():
        raise ValueError(f"data directory {args.data_dir} does not exist")
    layout = DataLayout(args.data_dir.resolve())
    datacenters = choose_datacenters(layout, args.datacenters)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    log = logging.getLogger("photon")
    if not args.verbose:
        for noisy in ("photon.sensors", "dagster", "py4j", "alembic"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        summary = run_until_idle(
            layout, datacenters, log, args.timeout_seconds, run_log_level="DEBUG" if args.verbose else "WARNING"
        )
    except RunnerError as error:
        print(f"photon: error: {error}", file=sys.stderr)
        return 1
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


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"gen": command_gen, "run": command_run}[args.command](args)
    except ValueError as error:
        print(f"photon: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
