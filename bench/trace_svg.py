"""One request's trace as an SVG waterfall: a row per span, nested under its parent, a bar
from its start to its end on a time axis in ms, coloured by the process that recorded it.
Plain SVG text, no plotting library."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from html import escape

from bench.otlp_receiver import ReceivedSpan

COLOURS = {  # by service.name
    "splitserve-router": "#4c78a8",
    "splitserve-prefill": "#f58518",
    "splitserve-decode": "#54a24b",
}
OTHER = "#9d9d9d"
WIDTH, LABELS, RIGHT = 1000, 300, 150  # px: the picture, the label column, the right margin
ROW, BAR, TOP = 20, 13, 52  # px: a row, a bar's height, the space above the first row
INDENT = 12  # px per nesting level


def in_order(spans: Sequence[ReceivedSpan]) -> list[tuple[int, ReceivedSpan]]:
    """(depth, span) depth first from the roots, children by start time; a span whose parent
    is not in `spans` is a root."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)

    def walk(parent: str, depth: int) -> Iterator[tuple[int, ReceivedSpan]]:
        for s in sorted(children.get(parent, []), key=lambda s: (s.start_ns, -s.end_ns)):
            yield depth, s
            yield from walk(s.span_id, depth + 1)

    return list(walk("", 0))


def tick_ms(total_ms: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) for at most 10 ticks over `total_ms`."""
    base = 10 ** math.floor(math.log10(total_ms / 10))
    return next(base * m for m in (1, 2, 5, 10) if total_ms / (base * m) <= 10)


def note(span: ReceivedSpan) -> str:
    """What a row says after its bar: its length, and for a KV read what moved how fast."""
    text = f"{span.ms:.1f} ms"
    attrs = span.attrs
    if span.name == "decode.kv_transfer" and "splitserve.bytes" in attrs:
        text += f", {attrs['splitserve.bytes'] / 1e6:.1f} MB"
        if "splitserve.gbps" in attrs:
            text += f" at {attrs['splitserve.gbps']:.2f} GB/s"
    if span.name == "decode.generate" and "splitserve.tokens" in attrs:
        text += f", {attrs['splitserve.tokens']} tokens"
    return text


def render(spans: Sequence[ReceivedSpan], title: str) -> str:
    """The SVG text of `spans` (one trace)."""
    rows = in_order(spans)
    if not rows:
        raise ValueError("no spans to draw")
    t0 = min(s.start_ns for _, s in rows)
    total_ms = max((max(s.end_ns for _, s in rows) - t0) / 1e6, 1e-3)
    chart = WIDTH - LABELS - RIGHT
    height = TOP + ROW * len(rows) + 40

    def x(ns: int) -> float:
        return LABELS + chart * (ns - t0) / 1e6 / total_ms

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="8" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    out += _axis(total_ms, chart, TOP + ROW * len(rows))
    for i, (depth, s) in enumerate(rows):
        y = TOP + i * ROW
        colour = COLOURS.get(s.service, OTHER)
        left, right = x(s.start_ns), max(x(s.end_ns), x(s.start_ns) + 1)
        out.append(f'<text x="{8 + depth * INDENT}" y="{y + BAR - 2}">{escape(s.name)}</text>')
        out.append(
            f'<rect x="{left:.1f}" y="{y}" width="{right - left:.1f}" height="{BAR}" '
            f'fill="{colour}"><title>{escape(s.service)} {escape(s.name)}</title></rect>'
        )
        out.append(f'<text x="{right + 4:.1f}" y="{y + BAR - 2}">{escape(note(s))}</text>')
    out += _legend(height - 14)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _axis(total_ms: float, chart: float, bottom: int) -> list[str]:
    step, lines = tick_ms(total_ms), []
    k = 0
    while k * step <= total_ms + 1e-9:
        px = LABELS + chart * k * step / total_ms
        label = f"{k * step:g} ms"
        lines.append(f'<line x1="{px:.1f}" y1="{TOP - 6}" x2="{px:.1f}" y2="{bottom}" '
                     f'stroke="#dddddd"/>')  # fmt: skip
        lines.append(f'<text x="{px:.1f}" y="{TOP - 10}" text-anchor="middle">{label}</text>')
        k += 1
    return lines


def _legend(y: int) -> list[str]:
    out, x = [], 8
    for service, colour in COLOURS.items():
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x + 14}" y="{y}">{service}</text>')
        x += 170
    return out
