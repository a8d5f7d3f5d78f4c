"""Cost per completed run against the preemption rate, one line per strategy, as a plain SVG.

The rate is swept around the job's own (per-node mean time between preemptions from a quarter to
four times the given one), everything else as given; a trace is scaled the same way.
"""

from __future__ import annotations

import dataclasses
from html import escape
from pathlib import Path

from slurm_preempt.simulate import engine, results
from slurm_preempt.simulate.spec import HOUR, JobSpec
from slurm_preempt.simulate.strategies import strategies

SCALES = (4.0, 2.83, 2.0, 1.41, 1.0, 0.71, 0.5, 0.35, 0.25)  # of the mean time between preemptions
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 780, 420, 70, 290, 40, 50
Y_TICK = 0.2
COLOURS = ("#444444", "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22")


def sweep(spec: JobSpec, count: int, seed: int) -> dict[str, list[tuple[float, float]]]:
    """Per strategy label: (preemptions per node-hour, cost as a share of on-demand) points."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for scale in SCALES:
        scaled = _scaled(spec, scale)
        rate = HOUR / scaled.field.mean_gap_seconds
        for strategy in strategies(scaled):
            summary = results.summarise(scaled, strategy, engine.simulate(scaled, strategy, count, seed))
            if summary.cost_fraction is not None:
                lines.setdefault(strategy.label, []).append((rate, summary.cost_fraction))
    return lines


def _scaled(spec: JobSpec, scale: float) -> JobSpec:
    field = spec.field
    if field.trace_gaps:
        field = dataclasses.replace(field, trace_gaps=tuple(g * scale for g in field.trace_gaps))
    else:
        assert field.mtbp_hours is not None
        field = dataclasses.replace(field, mtbp_hours=field.mtbp_hours * scale)
    return dataclasses.replace(spec, field=field)


def write(spec: JobSpec, count: int, seed: int, path: Path) -> None:
    path.write_text(render(sweep(spec, count, seed), spec), encoding="utf-8")


def render(lines: dict[str, list[tuple[float, float]]], spec: JobSpec) -> str:
    points = [p for line in lines.values() for p in line]
    x_max = max(x for x, _ in points) * 1.05
    y_max = max(1.2, min(3.0, max(y for _, y in points) * 1.05))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def at(x: float, y: float) -> str:
        return f"{LEFT + x / x_max * plot_w:.1f},{TOP + plot_h - min(y, y_max) / y_max * plot_h:.1f}"

    title = f"{spec.nodes}-node {spec.work_hours:g} h job: cost per completed run against preemption rate"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif"'
        ' font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{LEFT}" y="20" font-size="14">{escape(title)}</text>',
        *_axes(x_max, y_max, at),
    ]
    for index, (label, line) in enumerate(lines.items()):
        colour = COLOURS[index % len(COLOURS)]
        path = " ".join(at(x, y) for x, y in sorted(line))
        dash = ' stroke-dasharray="7 4"' if index % 2 else ""  # lines that coincide stay both visible
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{path}"/>')
        y = TOP + 16 * index
        parts.append(
            f'<line x1="{WIDTH - RIGHT + 15}" y1="{y}" x2="{WIDTH - RIGHT + 35}" y2="{y}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
        )
        parts.append(f'<text x="{WIDTH - RIGHT + 40}" y="{y + 4}">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _axes(x_max: float, y_max: float, at) -> list[str]:
    bottom, top = at(0, 0), at(x_max, y_max)
    x0, y0 = bottom.split(",")
    x1, y1 = top.split(",")
    parts = [
        f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>',
        f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>',
        f'<text x="{x0}" y="{float(y0) + 38}">preemptions per node-hour</text>',
        f'<text x="10" y="{float(y1) - 8}">cost / on-demand</text>',
    ]
    for step in range(6):
        x = x_max * step / 5
        px, py = at(x, 0).split(",")
        parts.append(f'<text x="{px}" y="{float(py) + 18}" text-anchor="middle">{x:.2f}</text>')
    for step in range(int(y_max / Y_TICK) + 1):
        y = step * Y_TICK
        qx, qy = at(0, y).split(",")
        parts.append(f'<text x="{float(qx) - 6}" y="{float(qy) + 4}" text-anchor="end">{y:.1f}</text>')
    ox, oy = at(0, 1.0).split(",")
    ex, _ = at(x_max, 1.0).split(",")
    parts.append(f'<line x1="{ox}" y1="{oy}" x2="{ex}" y2="{oy}" stroke="#999" stroke-dasharray="4 3"/>')
    return parts
