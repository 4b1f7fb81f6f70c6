"""A result or stats dict as one metric / value table: how benchmarks and `harvest status` print numbers."""

from rich.console import Console
from rich.table import Table


def print_table(title: str, values, console: Console) -> None:
    """A (nested) dict as metric / value rows, nested keys joined with '.'."""
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in _rows(values):
        table.add_row(key, "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)


def _rows(values, prefix: str = ""):
    if not isinstance(values, dict):
        yield prefix.rstrip(".") or "value", values
        return
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _rows(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
