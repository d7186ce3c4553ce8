"""The result of a verify run: tables for people, a JSON report for machines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from onceflow.verify.anomalies import KINDS
from onceflow.verify.harness import VerifyRun

MAX_ANOMALIES_PER_KIND = 1000  # in the JSON report; the counts are always complete
EXAMPLES_PER_KIND = 3  # in the table
MIRROR_FIGURES = ("mirror_caught_up", "mirror_values", "target_kills", "mirror_exits")


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, column in enumerate(columns):
        table.add_column(column, justify="right" if i else "left")
    return table


def operations_table(run: VerifyRun) -> Table:
    s = run.result.stats
    table = _table("Operations", "", "count")
    rows: list[tuple[str, object]] = [
        ("transactions", s["transactions"]),
        ("  committed (acknowledged)", s["committed"]),
        ("  aborted (or certainly not committed)", s["aborted"]),
        ("    of which on purpose", s["aborted_on_purpose"]),
        ("  outcome unknown", s["unknown"]),
        ("    of which found committed", s["unknown_committed"]),
        ("  consume-transform-produce", s["copy_transactions"]),
        ("values written", s["values_written"]),
        ("values committed (final read)", s["values_committed"]),
        ("records polled by consumers", s["polls_records"]),
        ("group offset reads", s["offset_reads"]),
        ("history operations", s["operations"]),
    ]
    if "keys" in s:  # a compacted topic
        rows += [
            ("keys (compacted topic)", s["keys"]),
            ("  last committed value checked", s["keys_checked"]),
            ("    of which deleted (tombstone)", s["keys_deleted"]),
            ("tombstones written", s["tombstones_written"]),
            ("values cleaned away, superseded", s["cleaned_superseded"]),
            ("  aborted", s["cleaned_aborted"]),
            ("  tombstones", s["cleaned_tombstones"]),
        ]
    if "database_rows" in s:  # the database workload
        rows += [
            ("database stores (transactions)", s["database_stores"]),
            ("  committed (acknowledged)", s["database_stores_committed"]),
            ("  rolled back (or killed before commit)", s["database_stores_rolled_back"]),
            ("  outcome unknown", s["database_stores_unknown"]),
            ("rows in the table (final read)", s["database_rows"]),
            ("committed input not stored", s["database_unstored"]),
            ("loaders killed (crash-client)", s["database_loader_kills"]),
            ("  of which interrupted a store", s["database_stores_killed"]),
        ]
    if "loaders_drained" in run.details:
        rows.append(
            ("input all stored at the end", "yes" if run.details["loaders_drained"] else "no")
        )
    if "cleaner_rounds" in run.details:
        rows.append(("cleaner rounds (broker log)", run.details["cleaner_rounds"]))
    if "copiers_drained" in run.details:
        rows.append(
            ("input all copied at the end", "yes" if run.details["copiers_drained"] else "no")
        )
    if "mirror_caught_up" in run.details:
        rows += [
            ("mirror caught up at the end", "yes" if run.details["mirror_caught_up"] else "no"),
            ("values on the target (final read)", run.details.get("mirror_values", 0)),
        ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def faults_table(run: VerifyRun) -> Table:
    table = _table("Faults", "kind", "injected")
    for kind in run.options.faults:
        if kind in run.unavailable:
            table.add_row(kind, f"unavailable: {run.unavailable[kind]}")
        else:
            table.add_row(kind, str(run.faults_injected.get(kind, 0)))
            if kind == "kill" and "target_kills" in run.details:
                table.add_row("  of which the target broker", str(run.details["target_kills"]))
    for role, count in run.details.get("node_faults", {}).items():
        table.add_row(f"  node chosen as {role}", str(count))
    exits = run.details.get("broker_exits")
    if exits:
        table.add_row("broker halts (restarted)", str(exits))
    if run.details.get("mirror_exits"):
        table.add_row("mirror driver exits (restarted)", str(run.details["mirror_exits"]))
    if not run.options.faults:
        table.add_row("none", "0")
    return table


def anomalies_table(run: VerifyRun) -> Table:
    table = _table("Anomalies", "kind", "count", "first")
    table.columns[2].justify = "left"
    by_kind = run.result.by_kind()
    for kind in KINDS:
        found = by_kind.get(kind, [])
        table.add_row(kind, str(len(found)), found[0].message if found else "")
    return table


def examples_table(run: VerifyRun) -> Table | None:
    """A few anomalies of each kind found, with their values and offsets."""
    if run.result.valid:
        return None
    table = _table("Examples", "kind", "details")
    table.columns[1].justify = "left"
    for kind, found in run.result.by_kind().items():
        for anomaly in found[:EXAMPLES_PER_KIND]:
            table.add_row(kind, json.dumps(anomaly.to_json(), default=str)[:400])
    return table


def target(run: VerifyRun) -> str:
    """What was verified: embedded, apache-kafka <version> x<nodes>, or the bootstrap list."""
    if run.options.embedded:
        return "embedded"
    kafka = run.details.get("apache_kafka")
    if kafka is not None:
        return f"apache-kafka {kafka['version']} x{kafka['nodes']}"
    return str(run.options.bootstrap)


def summary(run: VerifyRun) -> dict[str, Any]:
    """The figures of the run, without the anomalies themselves (one line of JSON)."""
    return {
        "valid": run.result.valid,
        "ok": run.ok,
        "seed": run.options.seed,
        "workload": run.options.workload,
        "target": target(run),
        "duration_s": run.options.duration_s,
        "elapsed_s": round(run.elapsed_s, 1),
        **({"check_s": run.details["check_s"]} if "check_s" in run.details else {}),
        "faults_requested": list(run.options.faults),
        "faults_injected": run.faults_injected,
        "faults_unavailable": run.unavailable,
        "operations": {k: v for k, v in run.result.stats.items() if k != "faults"},
        "anomalies": run.result.counts(),
        **(
            {"cleaner_rounds": run.details["cleaner_rounds"]}
            if "cleaner_rounds" in run.details
            else {}
        ),
        **{k: run.details[k] for k in MIRROR_FIGURES if k in run.details},
        **({"node_faults": run.details["node_faults"]} if "node_faults" in run.details else {}),
        "errors": run.errors,
    }


def report_json(run: VerifyRun) -> dict[str, Any]:
    """The whole report: the summary, every anomaly (up to a cap per kind) and where the
    history and logs are kept."""
    anomalies: dict[str, list[dict[str, Any]]] = {}
    for kind, found in run.result.by_kind().items():
        if found:
            anomalies[kind] = [a.to_json() for a in found[:MAX_ANOMALIES_PER_KIND]]
    kept = run.work_dir.exists()
    return {
        **summary(run),
        "anomaly_details": anomalies,
        "notes": run.notes,
        "details": run.details,
        "history": str(run.history_path) if kept else None,
        "work_dir": str(run.work_dir) if kept else None,
    }


def write_json(run: VerifyRun, path: Path) -> None:
    path.write_text(json.dumps(report_json(run), indent=2, default=str) + "\n")
