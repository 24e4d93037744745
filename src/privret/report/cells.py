"""How one value of a run prints in a report's table cell, and an HTML table of such cells.

Every text taken from the run goes through :func:`escape` (HTML-escaped, quotes included).
"""

from __future__ import annotations

import html
import math

from privret.privacy.ledger import format_epsilon
from privret.report.collect import Row, parse_eps


def escape(text) -> str:
    return html.escape(str(text), quote=True)


def number_cell(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def epsilon_cell(value) -> str:
    return format_epsilon(value, digits=3, infinity="∞")


def delta_cell(row: Row) -> str:
    d = (row.ledger or {}).get("delta")
    if d in (None, 0, 0.0) or row.epsilon is None or math.isinf(row.epsilon):
        return "-"
    return f"{d:.2g}"


def unit_cell(row: Row) -> str:
    if row.method == "zero-shot":
        return "-"
    return str((row.ledger or {}).get("unit", "?"))


def html_table(headers: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def epsilon_value(value) -> float | None:
    """An epsilon as a results file holds it (a number, or ``"inf"``/``"Infinity"``) as a float; None stays None."""
    return None if value is None else parse_eps(str(value))
