"""The table a chaos run ends with, and its JSON."""

from __future__ import annotations

from collections.abc import Sequence

from bench.chaos.run import FaultRow

COLUMNS = (
    ("fault", "fault"),
    ("requests", "requests"),
    ("identical", "identical"),
    ("tie", "tie"),
    ("failed clearly", "failed_clearly"),
    ("lost", "lost"),
    ("hung", "hung"),
    ("leaked blocks", "leaked_blocks"),
    ("heal s", "heal_s"),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("TTFT p99 ms", "ttft_p99_ms"),
)


def table(rows: Sequence[FaultRow]) -> str:
    """A Markdown table, one line per fault."""
    cells = [[_cell(getattr(r, attr)) for _, attr in COLUMNS] for r in rows]
    head = [title for title, _ in COLUMNS]
    widths = [max(len(x) for x in col) for col in zip(head, *cells, strict=True)]
    lines = [_line(head, widths), _line(["-" * w for w in widths], widths)]
    return "\n".join(lines + [_line(c, widths) for c in cells])


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def explain(rows: Sequence[FaultRow]) -> str:
    """What went wrong, fault by fault: unclean audits and answers that were not identical."""
    out = []
    for row in rows:
        for problem in row.problems:
            out.append(f"{row.fault}: {problem}")
        for bad in row.not_identical:
            if bad["kind"] not in ("failed_clearly", "tie"):
                out.append(f"{row.fault}: request {bad['request']} {bad['kind']}: {bad['why']}")
    return "\n".join(out)
