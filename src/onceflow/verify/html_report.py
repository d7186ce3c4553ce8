"""`onceflow verify --report DIR`: one self-contained HTML page (the timeline drawn as an
inline SVG, no file beside it needed) with the checker's tables and the command that
reproduces the run, plus timeline.json, the figures the picture was drawn from."""

from __future__ import annotations

import html
import io
import json
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.verify.harness import VerifyRun
from onceflow.verify.report import summary
from onceflow.verify.timeline import Timeline, timeline

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FAULT_ID = "fault-"  # the SVG id of each fault's shaded interval (one per fault)
FAULT_COLOURS = {
    "kill": "#d62728",
    "pause": "#ff7f0e",
    "partition": "#9467bd",
    "crash-client": "#8c564b",
    "disk": "#7f7f7f",
    "kill-mirror": "#e377c2",
    "lagging-failover": "#17becf",
}


def reproduce_command(run: VerifyRun) -> str:
    """The command line that runs the same schedule again (the seed fixed)."""
    o = run.options
    args = ["onceflow", "verify"]
    if o.apache_kafka is not None:
        args += ["--apache-kafka", o.apache_kafka, "--nodes", str(o.nodes)]
        for key, value in o.kafka_settings:
            args += ["--override", f"{key}={value}"]
    elif o.bootstrap is not None:
        args += ["--bootstrap-server", o.bootstrap]
    else:
        args.append("--embedded")
    if o.mirror:
        args.append("--mirror")
    args += ["--duration", f"{o.duration_s:g}s", "--faults", ",".join(o.faults) or "none"]
    args += ["--seed", str(o.seed), "--workload", o.workload]
    args += ["--producers", str(o.producers), "--copiers", str(o.copiers)]
    args += ["--transaction-timeout-ms", str(o.transaction_timeout_ms)]
    return shlex.join(args)


def draw(line: Timeline, title: str, width_in: float = 11.0) -> Figure:
    """The timeline: throughput above, latency below, faults shaded in both (the upper
    one's shading carries the id), halts and restarts as lines, anomalies as crosses."""
    from matplotlib.figure import Figure  # imported here: only reports need matplotlib
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    figure = Figure(figsize=(width_in, 5.2), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(1, 1))
    times = [i * line.bin_s for i in range(len(line.committed_per_s))]
    top.step(times, line.committed_per_s, where="post", color="#1f77b4", lw=1.2)
    top.set_ylabel("committed txns/s")
    top.set_ylim(bottom=0)
    top.set_title(title, loc="left", fontsize=10)
    for series, name, style in (
        (line.latency_p50_ms, "p50", "-"),
        (line.latency_p99_ms, "p99", "--"),
    ):
        gaps = [math.nan if v is None else v for v in series]  # no line across a stall
        bottom.plot(times, gaps, style, lw=1.1, label=f"latency {name}")
    bottom.set_ylabel("end-to-end latency (ms)")
    bottom.set_xlabel("seconds since the run started")
    if any(v for v in line.latency_p99_ms):
        bottom.set_yscale("log")
    kinds: dict[str, str] = {}
    for i, span in enumerate(line.faults):
        colour = FAULT_COLOURS.get(span.kind, "#bcbd22")
        kinds[span.kind] = colour
        top.axvspan(span.start, span.end, color=colour, alpha=0.22, lw=0, gid=f"{FAULT_ID}{i}")
        bottom.axvspan(span.start, span.end, color=colour, alpha=0.22, lw=0)
    for event in line.events:
        style = ":" if event.event == "restarted" else "-"
        for axes in (top, bottom):
            axes.axvline(event.time, color="black", ls=style, lw=0.8)
    if line.anomalies:
        peak = max(line.committed_per_s, default=0) or 1
        top.plot(
            [a.time for a in line.anomalies],
            [peak * 1.05] * len(line.anomalies),
            "x",
            color="red",
            ms=7,
        )
    handles: list[Any] = [Patch(color=c, alpha=0.35, label=k) for k, c in sorted(kinds.items())]
    if any(e.event != "restarted" for e in line.events):
        handles.append(Line2D([], [], color="black", lw=0.8, label="halt (broker or mirror)"))
    if any(e.event == "restarted" for e in line.events):
        handles.append(Line2D([], [], color="black", ls=":", lw=0.8, label="restart"))
    if line.anomalies:
        label = f"anomalies ({len(line.anomalies)})"
        handles.append(Line2D([], [], color="red", marker="x", ls="", label=label))
    if handles:
        top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    top.set_xlim(0, max(line.end, 1.0))
    return figure


def render_svg(line: Timeline, title: str, width_in: float = 11.0) -> str:
    """The timeline as SVG markup, to inline in a page."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text: smaller, searchable
        draw(line, title, width_in).savefig(buffer, format="svg")
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # inline: without the XML prologue and doctype


def render_png(line: Timeline, title: str, path: Path, width_in: float = 9.0) -> None:
    """The same picture as a small PNG (for a README)."""
    draw(line, title, width_in).savefig(path, format="png", dpi=72)


def _table(title: str, rows: list[tuple[str, Any]]) -> str:
    body = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    return f"<h2>{html.escape(title)}</h2><table>{body}</table>"


STYLE = """body{font-family:sans-serif;max-width:1200px;margin:1em auto;color:#222}
table{border-collapse:collapse;margin-bottom:1em}td{padding:2px 10px;border-bottom:1px solid #ddd}
td:nth-child(2){text-align:right}pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap}
.bad{color:#b00}"""


def render_html(run: VerifyRun, line: Timeline, svg: str) -> str:
    s = summary(run)
    verdict = "no anomalies" if run.result.valid else f"{len(run.result.anomalies)} anomalies"
    operations = [(k, v) for k, v in run.result.stats.items() if k != "faults"]
    faults = [(kind, run.faults_injected.get(kind, 0)) for kind in run.options.faults]
    faults += [(f"{k} (unavailable)", why) for k, why in run.unavailable.items()]
    faults += [("broker halts", run.details.get("broker_exits", 0))]
    anomalies = list(run.result.counts().items())
    examples = "".join(
        f"<li><b>{html.escape(a.kind)}</b>: {html.escape(a.message)}</li>"
        for a in run.result.anomalies[:50]
    )
    timing = [
        ("run (s)", run.details.get("run_s", "")),
        ("check (s)", run.details.get("check_s", "")),
        ("elapsed (s)", round(run.elapsed_s, 1)),
    ]
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in run.notes + run.errors)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>onceflow verify: {html.escape(verdict)}</title><style>{STYLE}</style></head>"
        f"<body><h1>onceflow verify: <span class='{'' if run.ok else 'bad'}'>"
        f"{html.escape(verdict)}</span></h1>"
        f"<p>target {html.escape(str(s['target']))}, workload {html.escape(run.options.workload)}, "
        f"seed {run.options.seed}, {len(line.faults)} faults</p>"
        f"<h2>Reproduce</h2><pre>{html.escape(reproduce_command(run))}</pre>"
        f"<figure>{svg}</figure>"
        + _table("Anomalies", anomalies)
        + (f"<ul>{examples}</ul>" if examples else "")
        + _table("Operations", operations)
        + _table("Faults", faults)
        + _table("Time", timing)
        + (f"<h2>Notes and errors</h2><ul>{notes}</ul>" if notes else "")
        + "</body></html>\n"
    )


def write_report(run: VerifyRun, directory: Path) -> Path:
    """Write DIR/index.html and DIR/timeline.json; returns the HTML's path."""
    directory.mkdir(parents=True, exist_ok=True)
    line = timeline(run.history, run.result.anomalies)
    title = (
        f"onceflow verify, seed {run.options.seed}: {','.join(run.options.faults) or 'no faults'}"
    )
    svg = render_svg(line, title)
    page = directory / "index.html"
    page.write_text(render_html(run, line, svg), encoding="utf-8")
    (directory / "timeline.json").write_text(json.dumps(line.to_json(), indent=1) + "\n")
    return page
