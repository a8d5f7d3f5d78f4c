"""A picture of one job's attempts: a self-contained SVG (or an HTML page holding it), no assets.

One row per node; each attempt is a bar on the nodes it ran on, labelled with its number and why it
ended. Checkpoints are ticks, the notice and deadline are marks, work lost after the last checkpoint
is hatched, and the waits between attempts are drawn on a row of their own. Time runs left to right
from the first start.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from html import escape
from pathlib import Path

from slurm_preempt.errors import UsageError
from slurm_preempt.records.attempts import Attempt, JobHistory, seconds_text

WIDTH = 960
LEFT = 110  # room for node names
RIGHT = 30
ROW = 46
TOP = 58
COLORS = {
    "run": "#4c9f70",
    "preempted": "#d9822b",
    "failed": "#c23030",
    "lost": "#c23030",
    "wait": "#8a9ba8",
    "notice": "#d9822b",
    "deadline": "#c23030",
    "checkpoint": "#182026",
}


def _nice_step(span: float) -> float:
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400):
        if span / step <= 10:
            return step
    return 86400 * max(1, int(span / 86400 / 10))


class _Scale:
    def __init__(self, start: datetime, end: datetime):
        self.start = start
        self.span = max(1.0, (end - start).total_seconds())

    def x(self, moment: datetime) -> float:
        offset = (moment - self.start).total_seconds()
        return LEFT + (WIDTH - LEFT - RIGHT) * max(0.0, min(offset, self.span)) / self.span


def _bounds(history: JobHistory) -> tuple[datetime, datetime]:
    moments = []
    for a in history.attempts:
        moments += [m for m in (a.start, a.end, a.notice_time, a.deadline) if m is not None]
        moments += a.checkpoints
    if not moments:
        raise UsageError(f"job {history.job_id} has no recorded attempt to draw")
    return min(moments), max(moments)


def _bar_color(attempt: Attempt) -> str:
    if attempt.preempted:
        return COLORS["preempted"]
    if attempt.cause.startswith(("failed", "killed", "cancelled", "time limit", "node failure")):
        return COLORS["failed"]
    return COLORS["run"]


def render_svg(history: JobHistory, now: datetime | None = None) -> str:
    start, end = _bounds(history)
    if now is not None and any(a.end is None for a in history.attempts):
        end = max(end, now)
    scale = _Scale(start, end)
    nodes: list[str] = []
    for attempt in history.attempts:
        nodes += [n for n in attempt.nodes or ["?"] if n not in nodes]
    rows = {node: TOP + i * ROW for i, node in enumerate(nodes)}
    wait_row = TOP + len(nodes) * ROW
    axis_y = wait_row + ROW
    height = axis_y + 110
    parts = [_header(history, height), _grid(scale, TOP - 10, axis_y)]
    for node, y in rows.items():
        parts.append(
            f'<text x="{LEFT - 8}" y="{y + 22}" text-anchor="end" class="label">{escape(node)}</text>'
        )
    parts.append(
        f'<text x="{LEFT - 8}" y="{wait_row + 22}" text-anchor="end" class="label muted">waiting</text>'
    )
    for attempt in history.attempts:
        parts += _attempt(attempt, scale, rows, end)
    parts += _waits(history, scale, wait_row)
    parts.append(_legend(axis_y + 40))
    parts.append("</svg>")
    return "\n".join(parts)


def _header(history: JobHistory, height: int) -> str:
    pre = sum(1 for a in history.attempts if a.preempted)
    title = (
        f"Job {history.job_id}: {len(history.attempts)} attempt(s), {pre} preemption(s), "
        f"{seconds_text(history.lost_seconds)} of work lost"
    )
    if history.user:
        title += f" (user {history.user})"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">\n'
        "<style>.label{fill:#182026;font-size:12px}.muted{fill:#5c7080}.small{font-size:10px}"
        ".title{font-size:15px;font-weight:bold}</style>\n"
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f5d0d0"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{COLORS["lost"]}" stroke-width="3"/></pattern></defs>\n'
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>\n'
        f'<text x="12" y="24" class="title">{escape(title)}</text>'
    )


def _grid(scale: _Scale, top: float, axis_y: float) -> str:
    step = _nice_step(scale.span)
    out = [f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - RIGHT}" y2="{axis_y}" stroke="#5c7080"/>']
    tick = 0.0
    while tick <= scale.span + 1e-6:
        x = LEFT + (WIDTH - LEFT - RIGHT) * tick / scale.span
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}" stroke="#e1e8ed"/>')
        out.append(
            f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle" class="label small">'
            f"+{seconds_text(tick)}</text>"
        )
        tick += step
    stamp = scale.start.strftime("%Y-%m-%d %H:%M:%S UTC")
    out.append(f'<text x="{LEFT}" y="{axis_y + 32}" class="label small muted">time since {stamp}</text>')
    return "\n".join(out)


def _attempt(attempt: Attempt, scale: _Scale, rows: Mapping[str, float], end: datetime) -> list[str]:
    if attempt.start is None:
        return []
    x0, x1 = scale.x(attempt.start), scale.x(attempt.end or end)
    width = max(2.0, x1 - x0)
    out = ['<g class="attempt">']
    for index, node in enumerate(attempt.nodes or ["?"]):
        y = rows[node]
        out.append(
            f'<rect x="{x0:.1f}" y="{y + 8}" width="{width:.1f}" height="22" rx="3" '
            f'fill="{_bar_color(attempt)}"><title>{escape(_tooltip(attempt))}</title></rect>'
        )
        if attempt.lost_seconds > 0 and attempt.end is not None:
            lx = scale.x(attempt.last_checkpoint or attempt.start)
            out.append(
                f'<rect x="{lx:.1f}" y="{y + 8}" width="{max(1.0, x1 - lx):.1f}" height="22" '
                f'fill="url(#hatch)" stroke="{COLORS["lost"]}" stroke-width="0.5"/>'
            )
        for mark in attempt.checkpoints:
            cx = scale.x(mark)
            out.append(
                f'<line x1="{cx:.1f}" y1="{y + 4}" x2="{cx:.1f}" y2="{y + 34}" '
                f'stroke="{COLORS["checkpoint"]}" stroke-width="2"/>'
            )
        if index == 0:
            label = f"#{attempt.number} {attempt.cause}"
            out.append(f'<text x="{x0 + 3:.1f}" y="{y + 4}" class="label small">{escape(label)}</text>')
        out += _notice_marks(attempt, scale, y)
    out.append("</g>")
    return out


def _notice_marks(attempt: Attempt, scale: _Scale, y: float) -> list[str]:
    out = []
    if attempt.notice_time is not None:
        nx = scale.x(attempt.notice_time)
        out.append(
            f'<line x1="{nx:.1f}" y1="{y + 8}" x2="{nx:.1f}" y2="{y + 32}" stroke="{COLORS["notice"]}" '
            'stroke-width="2"/>'
        )
        out.append(
            f'<path d="M{nx - 6:.1f},{y + 40} L{nx + 6:.1f},{y + 40} L{nx:.1f},{y + 31} Z" '
            f'fill="{COLORS["notice"]}"><title>notice (drain)</title></path>'
        )
    if attempt.deadline is not None:
        dx = scale.x(attempt.deadline)
        out.append(
            f'<line x1="{dx:.1f}" y1="{y}" x2="{dx:.1f}" y2="{y + 38}" stroke="{COLORS["deadline"]}" '
            'stroke-width="2" stroke-dasharray="4,3"><title>deadline</title></line>'
        )
    return out


def _tooltip(attempt: Attempt) -> str:
    return (
        f"attempt {attempt.number} on {','.join(attempt.nodes)}: ran {seconds_text(attempt.run_seconds)}, "
        f"{attempt.cause}, lost {seconds_text(attempt.lost_seconds)}"
        + "".join(
            f"; shrank {s.nodes_before} -> {s.nodes_after} (idle {seconds_text(s.cost_seconds)})"
            for s in attempt.shrinks
        )
    )


def _waits(history: JobHistory, scale: _Scale, y: float) -> list[str]:
    out = []
    for before, after in zip(history.attempts, history.attempts[1:], strict=False):
        if before.end is None or after.start is None:
            continue
        x0, x1 = scale.x(before.end), scale.x(after.start)
        out.append(
            f'<line x1="{x0:.1f}" y1="{y + 19}" x2="{x1:.1f}" y2="{y + 19}" stroke="{COLORS["wait"]}" '
            'stroke-width="6" stroke-dasharray="2,3"/>'
        )
        out.append(
            f'<text x="{(x0 + x1) / 2:.1f}" y="{y + 40}" text-anchor="middle" class="label small muted">'
            f"waited {seconds_text(after.wait_before or 0)}</text>"
        )
    return out


def _legend(y: float) -> str:
    items = [
        (f'<rect width="18" height="10" fill="{COLORS["run"]}"/>', "ran, ended well"),
        (f'<rect width="18" height="10" fill="{COLORS["preempted"]}"/>', "ran, preempted"),
        (f'<rect width="18" height="10" fill="{COLORS["failed"]}"/>', "ran, failed"),
        ('<rect width="18" height="10" fill="url(#hatch)"/>', "work lost"),
        (
            f'<line x1="9" y1="-3" x2="9" y2="13" stroke="{COLORS["checkpoint"]}" stroke-width="2"/>',
            "checkpoint",
        ),
        (f'<path d="M3,10 L15,10 L9,1 Z" fill="{COLORS["notice"]}"/>', "notice (drain)"),
        (
            f'<line x1="9" y1="-3" x2="9" y2="13" stroke="{COLORS["deadline"]}" stroke-width="2" '
            'stroke-dasharray="4,3"/>',
            "deadline",
        ),
        (
            f'<line x1="0" y1="5" x2="18" y2="5" stroke="{COLORS["wait"]}" stroke-width="6" '
            'stroke-dasharray="2,3"/>',
            "waiting",
        ),
    ]
    out = []
    x = 12.0
    for symbol, text in items:
        out.append(
            f'<g transform="translate({x:.0f},{y})">{symbol}'
            f'<text x="24" y="10" class="label small">{escape(text)}</text></g>'
        )
        x += 32 + 7 * len(text)
    return "\n".join(out)


def write(history: JobHistory, path: Path | str) -> Path:
    """Write the picture as ``.svg`` or as a self-contained ``.html`` page."""
    path = Path(path)
    svg = render_svg(history)
    if path.suffix.lower() == ".svg":
        text = svg
    elif path.suffix.lower() in (".html", ".htm"):
        text = (
            f"<!doctype html>\n<html><head><meta charset='utf-8'><title>Job {escape(history.job_id)}"
            f"</title></head>\n<body style='margin:16px'>\n{svg}\n</body></html>\n"
        )
    else:
        raise UsageError(f"--timeline {path}: give a file ending in .svg or .html")
    path.write_text(text)
    return path
