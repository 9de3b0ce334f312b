"""The benchmark tables, laid out by rich (issue 13) as Markdown: plain text with no colour codes
and no carriage returns, so one rendering reads the same in a terminal, a log, an editor, bench.txt
and on GitHub.

The first ``labels`` columns hold names and are left-aligned; the others hold figures and are
right-aligned (``---:`` in the delimiter row, so GitHub aligns them too). No cell is wrapped or
cut: the columns never wrap and the console is far wider than any row.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

# Wider than any table (the widest row is about 250 characters): rich never narrows a column.
WIDTH = 10_000


def markdown(headers: Sequence[str], rows: Iterable[Sequence[str]], labels: int = 0) -> list[str]:
    """A Markdown table of ``rows`` (cells already formatted, ``-`` for a figure not measured)
    under ``headers``, as lines of plain text after a blank line (Markdown tells a table from the
    text before it by one; text after the table needs one too)."""
    table = Table(box=box.MARKDOWN)
    for i, head in enumerate(headers):
        table.add_column(head, justify="left" if i < labels else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(cell.replace("|", "\\|") for cell in row))
    out = io.StringIO()
    console = Console(
        file=out,
        width=WIDTH,
        color_system=None,
        force_terminal=False,
        force_jupyter=False,
        markup=False,
        emoji=False,
        highlight=False,
    )
    console.print(table)
    # box.MARKDOWN has no top or bottom rule: rich draws them as lines of spaces, left out here.
    lines = [line.rstrip() for line in out.getvalue().splitlines() if line.strip()]
    rule = lines[1].split("|")  # "", then one run of dashes per column, then ""
    lines[1] = "|".join(cells if i <= labels or i > len(headers) else cells[:-1] + ":" for i, cells in enumerate(rule))
    return ["", *lines]
