"""Where the tools wheelmill drives live (the pinned uv of wheelmill's own env)."""

from __future__ import annotations

import uv


def uv_bin() -> str:
    return str(uv.find_uv_bin())
