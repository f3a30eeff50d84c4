"""What ``python -m study.report`` prints: plain-text tables within :data:`~study.search.console.WIDTH` (120)
columns, as a sweep's console lines are; the report's files hold every column in full.

:func:`text_table` aligns rows of strings; a table too wide first cuts its ``shrink`` column (long names lose their
middles, an ellipsis marks the cut), then leaves columns off from the right and says which on a last line.
"""

from __future__ import annotations

from study.search.console import WIDTH

GAP = "  "  # between columns
MIN_SHRUNK = 16  # characters a cut column keeps


def _cut(text: str, width: int, middle: bool = False) -> str:
    """``text`` in ``width`` characters: its end replaced by an ellipsis, or (``middle``) its middle, which keeps a
    name's start and end (``bert4re…samples``): variants of one model differ in their ends."""
    if len(text) <= width:
        return text
    if not middle:
        return text[: width - 1] + "…"
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def _width(columns: list[str], widths: dict[str, int]) -> int:
    return sum(widths[c] for c in columns) + len(GAP) * (len(columns) - 1)


def table_width(rows: list[dict[str, str]], indent: str = "  ") -> int:
    """The characters :func:`text_table` needs for ``rows`` without cutting or leaving off anything."""
    if not rows:
        return 0
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    return len(indent) + _width(columns, widths)


def text_table(rows: list[dict[str, str]], width: int = WIDTH, *, shrink: str | None = None,
               indent: str = "  ") -> list[str]:
    """``rows`` (dicts of strings, one key order) as aligned lines of at most ``width`` characters.

    The first column is left-aligned (names), the others right-aligned (numbers). The ``shrink`` column loses its
    cells' middles first; nothing is dropped silently: a last line names the columns left off.
    """
    if not rows:
        return []
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    room = width - len(indent)
    if shrink in widths and _width(columns, widths) > room:
        widths[shrink] = max(MIN_SHRUNK, len(shrink), widths[shrink] - (_width(columns, widths) - room))
    dropped = []
    while len(columns) > 1 and _width(columns, widths) > room:
        dropped.insert(0, columns.pop())

    def line(cells: dict[str, str]) -> str:
        parts = []
        for i, column in enumerate(columns):
            text = _cut(str(cells.get(column, "")), widths[column], middle=column == shrink)
            parts.append(text.ljust(widths[column]) if i == 0 else text.rjust(widths[column]))
        return _cut(indent + GAP.join(parts).rstrip(), width)

    lines = [line({c: c for c in columns}), *(line(r) for r in rows)]
    if dropped:
        lines.append(_cut(f"{indent}(left off to fit {width} columns: {', '.join(dropped)})", width))
    return lines
