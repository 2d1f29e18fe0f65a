"""Repeats of a headline benchmark side by side: `live` and `backlog` results of clean commits whose
product code is HEAD's (what `run.py merge` does for rate curves, and `chaos.py --merge` for faults),
as one result with each figure's value in every run and their min-max, so that a figure is cited
with its spread rather than from one run.

The figures kept per system are the ones the README cites and the issue's criteria read; each run's
`machine.cpu_calibration_seconds` is kept beside them, the machine's speed at that run."""

from __future__ import annotations

from benchmarks.rate_curve import is_rate_curve, merged_from, require_product_code_of_head, same_product_code, spread

# Where each figure is in one system's row of a result (a path of keys).
LIVE_FIGURES = {
    "p50_seconds": ("latency_seconds_all_joinable", "p50"),
    "p90_seconds": ("latency_seconds_all_joinable", "p90"),
    "p99_seconds": ("latency_seconds_all_joinable", "p99"),
    "joinable_clicks": ("joinable_clicks",),
    "joined_visible": ("joined_visible",),
    "peak_pss_bytes": ("peak_pss_bytes",),
    "cpu_seconds_per_1000_joined_clicks": ("cpu_seconds_per_1000_joined_clicks",),
}
BACKLOG_FIGURES = {
    "wall_seconds": ("wall_seconds",),
    "wall_to_done_seconds": ("wall_to_done_seconds",),
    "joined_clicks_per_second": ("joined_clicks_per_second",),
    "peak_pss_bytes": ("peak_pss_bytes",),
    "missing_clicks": ("correctness", "missing_clicks"),
    "extra_clicks": ("correctness", "extra_clicks"),
}


def kind(result: dict) -> str:
    """`live` or `backlog`, by the shape of the result (a live result's name is the run's --name)."""
    if "merged_from" in result or is_rate_curve(result):
        raise SystemExit(f"{result.get('benchmark')}: a merged result or a rate curve (rate curves merge by"
                         " rate_curve.merge)")
    if "rate_clicks_per_second" in result.get("workload", {}):
        return "live"
    if "targets" in result:
        return "backlog"
    raise SystemExit(f"{result.get('benchmark')}: neither a live nor a backlog result")


def at(row: dict, path: tuple[str, ...]):
    for key in path:
        row = row.get(key) if isinstance(row, dict) else None
    return row


def live_criteria(row: dict) -> dict:
    """The issue's per-run criteria for one system's row: every joinable click visible, and for a
    Photon system the hold beside other runs (`upkeep_hold_criterion`, per kind)."""
    out = {"every_joinable_visible": row.get("joined_visible") == row.get("joinable_clicks")}
    for name, criterion in (row.get("upkeep_hold_criterion") or {}).items():
        out[f"hold_{name}_seconds"] = criterion["hold_max_seconds"]
        out[f"hold_{name}_met"] = criterion["met"]
    if hold := row.get("upkeep_hold_criterion"):
        out["hold_alone_seconds"] = next(iter(hold.values()))["alone_hold_max_seconds"]
    return out


def system_rows(results: list[dict], figures: dict, criteria=None) -> dict:
    systems = {}
    for system in sorted({s for r in results for s in r["systems"]}):
        rows = [r["systems"].get(system) for r in results]
        merged = {name: spread([row and at(row, path) for row in rows]) for name, path in figures.items()}
        if criteria:
            per_run = [row and criteria(row) for row in rows]
            for name in sorted({k for c in per_run if c for k in c}):
                values = [c and c.get(name) for c in per_run]
                merged[name] = {"runs": values} if any(isinstance(v, bool) for v in values) else spread(values)
        systems[system] = merged
    return systems


def merge(results: list[dict], check_commit=same_product_code) -> dict:
    """Live or backlog results (all of one kind, one workload) of clean commits with HEAD's product
    code, as one: per system every figure with each run's value and min-max."""
    kinds = {kind(r) for r in results}
    if len(kinds) != 1:
        raise SystemExit(f"results of different benchmarks do not merge: {sorted(kinds)}")
    require_product_code_of_head(results, check_commit)
    workloads = {tuple(sorted((k, str(v)) for k, v in r["workload"].items() if k != "input_bytes")) for r in results}
    if len(workloads) != 1:
        raise SystemExit("the runs' workloads differ; only repeats of one workload merge")
    live = kinds == {"live"}
    return {"repeats_of": "live" if live else "backlog", "workload": results[0]["workload"],
            "merged_from": merged_from(results),
            "systems": system_rows(results, LIVE_FIGURES if live else BACKLOG_FIGURES,
                                   live_criteria if live else None)}


def table(result: dict) -> str:
    """Markdown: each system's figures as min-max over the runs."""
    def cell(value) -> str:
        if "min" not in value:
            return ", ".join("-" if v is None else ("yes" if v else "no") for v in value["runs"])
        if value["min"] is None:
            return "-"
        lo, hi = value["min"], value["max"]
        if max(abs(lo), abs(hi)) >= 2**30:
            return f"{lo / 2**30:.2f}-{hi / 2**30:.2f} GiB"
        return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
    names = sorted({n for row in result["systems"].values() for n in row})
    lines = ["| system | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for system, row in result["systems"].items():
        lines.append(f"| {system} | " + " | ".join(cell(row[n]) if n in row else "" for n in names) + " |")
    return "\n".join(lines)
