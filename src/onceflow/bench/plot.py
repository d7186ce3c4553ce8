"""`onceflow bench --plot FILE`: the throughput and latency figures as a picture (FILE.png or
FILE.svg) or a self-contained page (FILE.html: the SVG inline, the figures as a table).

Above: produce and consume records/s of each target and value size, the median round as the
bar and every round as a dot. Below: the producers' acknowledgement round trips (librdkafka's
p50 and p99 of each 1 s statistics window) over the produce phase, per target."""

from __future__ import annotations

import html
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

from onceflow.bench.throughput import Measurement

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = (".png", ".svg", ".html")
BAR_ID = "bar-"  # the SVG id of each median bar: bar-<produce|consume>-<target>-<value size>


def draw(measurements: list[Measurement], title: str) -> Figure:
    from matplotlib.figure import Figure  # imported here: only --plot needs matplotlib

    figure = Figure(figsize=(10, 6.5), layout="constrained")
    top, bottom = figure.subplots(2, 1, height_ratios=(1.2, 1))
    groups = [m for m in measurements if not m.error]
    names = [f"{m.target}\n{m.value_size} B" for m in groups]
    width = 0.38
    for shift, phase, colour in (
        (-width / 2, "produce", "#1f77b4"),
        (width / 2, "consume", "#2ca02c"),
    ):
        for i, m in enumerate(groups):
            median = m.produce if phase == "produce" else m.consume
            rounds = m.produce_rounds if phase == "produce" else m.consume_rounds
            if median is None:
                continue
            top.bar(
                i + shift,
                median.records_per_s,
                width,
                color=colour,
                label=phase if i == 0 else None,
                gid=f"{BAR_ID}{phase}-{m.target}-{m.value_size}",
            )
            top.plot([i + shift] * len(rounds), [r.records_per_s for r in rounds], ".k", ms=3)
    top.set_xticks(range(len(groups)), names, fontsize=8)
    top.set_ylabel("records/s (median round; dots: rounds)")
    top.set_title(title, loc="left", fontsize=10)
    top.legend(fontsize=8)
    plotted = False
    for m in groups:
        windows = [w for cost in m.produce_costs for w in cost.rtt_windows or []]
        if not windows:
            continue
        seconds = range(len(windows))
        label = f"{m.target} {m.value_size} B"
        line = bottom.plot(seconds, [w[1] / 1000 for w in windows], lw=1.1, label=f"{label} p50")
        bottom.plot(
            seconds,
            [w[2] / 1000 for w in windows],
            "--",
            lw=1.0,
            color=line[0].get_color(),
            label=f"{label} p99",
        )
        plotted = True
    bottom.set_xlabel("produce statistics window (1 s each, rounds one after another)")
    bottom.set_ylabel("ack round trip (ms)")
    if plotted:
        bottom.set_yscale("log")
        bottom.legend(fontsize=7, ncol=2)
    else:
        bottom.text(0.5, 0.5, "no round-trip statistics", ha="center", transform=bottom.transAxes)
    return figure


def _svg(figure: Figure) -> str:
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _rows(measurements: list[Measurement]) -> str:
    def cell(value: float | None) -> str:
        return "" if value is None or math.isnan(value) else f"{value:,.0f}"

    rows = []
    for m in measurements:
        produce = m.produce.records_per_s if m.produce else None
        consume = m.consume.records_per_s if m.consume else None
        cost = m.produce_cost
        rows.append(
            f"<tr><td>{html.escape(m.target)}</td><td>{m.value_size}</td>"
            f"<td>{cell(produce)}</td><td>{cell(consume)}</td>"
            f"<td>{'' if cost.rtt_p50_ms is None else f'{cost.rtt_p50_ms:.2f}'}</td>"
            f"<td>{'' if cost.rtt_p99_ms is None else f'{cost.rtt_p99_ms:.2f}'}</td>"
            f"<td>{html.escape(m.error or '')}</td></tr>"
        )
    head = (
        "<tr><th>target</th><th>value B</th><th>produce rec/s</th><th>consume rec/s</th>"
        "<th>ack p50 ms</th><th>ack p99 ms</th><th>error</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


def write_plot(measurements: list[Measurement], path: Path, title: str, command: str) -> None:
    """The figure as PNG, SVG or a self-contained HTML page (by the file's suffix)."""
    figure = draw(measurements, title)
    suffix = path.suffix.lower()
    if suffix == ".png":
        figure.savefig(path, format="png", dpi=80)
    elif suffix == ".svg":
        path.write_text(_svg(figure), encoding="utf-8")
    elif suffix == ".html":
        page = (
            "<!doctype html><html><head><meta charset='utf-8'><title>onceflow bench</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:1em auto}"
            "td,th{padding:2px 10px;text-align:right}pre{background:#f4f4f4;padding:.5em}</style>"
            f"</head><body><h1>onceflow bench</h1><pre>{html.escape(command)}</pre>"
            f"<figure>{_svg(figure)}</figure>{_rows(measurements)}</body></html>\n"
        )
        path.write_text(page, encoding="utf-8")
    else:
        raise ValueError(f"--plot {path}: the file must end in {', '.join(FORMATS)}")
