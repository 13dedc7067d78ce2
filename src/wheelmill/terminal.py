"""The terminal: the one console that every command writes its progress and summaries to.
Its own module, light, as every command makes one before it knows which it is."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console(stream: object = None) -> Console:
    """Progress and summaries go to stdout; stderr carries nothing but the error line."""
    file = stream or sys.stdout
    interactive = hasattr(file, "isatty") and file.isatty()
    return Console(file=file, width=None if interactive else 200, highlight=False, soft_wrap=False)  # type: ignore[arg-type]
