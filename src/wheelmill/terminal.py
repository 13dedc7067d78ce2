"""The terminal: the one console that every command writes its progress and summaries to.
Its own module, light, as every command makes one before it knows which it is."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console

from wheelmill.errors import redact


def make_console(stream: object = None) -> Console:
    """Progress and summaries go to stdout; stderr carries nothing but the error line."""
    file = stream or sys.stdout
    # A terminal's own width; else (a log, a pipe) 200 columns, whatever COLUMNS says (pytest's
    # workers set 80), so that a line of a CI log is not broken where a terminal would break it.
    interactive = hasattr(file, "isatty") and file.isatty()
    # every line a command prints passes the one redaction: a URL's password never shows
    return Console(file=RedactingStream(file), width=None if interactive else 200, highlight=False, soft_wrap=False)  # type: ignore[arg-type]


class RedactingStream:
    """A text stream that redacts what is written to it, and is otherwise the stream it wraps
    (a terminal stays a terminal to rich)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
