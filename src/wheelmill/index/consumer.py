"""Consumer settings: pip and uv configured to use exactly one index, the channel's.

Never ``--extra-index-url``: with two indexes pip takes the highest version of a name
from either (dependency confusion, and the silently-CPU torch of a public index); uv's
default index is the only one when nothing else is configured. The pip form also blanks
``extra-index-url`` and ``find-links`` a machine-wide pip.conf may set.
"""

from __future__ import annotations

import urllib.parse

from wheelmill.errors import UsageError


def base_url(text: str) -> str:
    """Where the index is served, as given on a command line: an http(s) URL and nothing
    else. The settings files are line-based; a value with a line break in it would add a
    line of its own (a second index) to them.

    >>> base_url("https://wheels.internal/")
    'https://wheels.internal/'
    """
    try:
        parts = urllib.parse.urlsplit(text)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok or '"' in text or any(ch.isspace() or not ch.isprintable() for ch in text):
        raise UsageError(
            f"--url {text!r}: not an http(s) URL of one line",
            fix="give where the index is served, e.g. https://wheels.internal",
        )
    return text


def channel_url(base: str, channel: str) -> str:
    return f"{base.rstrip('/')}/{channel}/simple/"


def pip_conf(url: str) -> str:
    return f"[global]\nindex-url = {url}\nextra-index-url =\nfind-links =\n"


def uv_toml(url: str, channel: str) -> str:
    return f'[[index]]\nname = "wheelmill-{channel.replace(".", "-")}"\nurl = "{url}"\ndefault = true\n'


def environment(url: str) -> str:
    """For container images: variables pip and uv both honour, no file needed."""
    return f"PIP_INDEX_URL={url}\nPIP_EXTRA_INDEX_URL=\nPIP_FIND_LINKS=\nUV_DEFAULT_INDEX={url}\n"


def format_settings(base: str, channel: str, form: str) -> str:
    """What `wheelmill index config` prints: the settings of one ``form`` (pip, uv, env), or all three."""
    url = channel_url(base, channel)
    match form:
        case "pip":
            return pip_conf(url)
        case "uv":
            return uv_toml(url, channel)
        case "env":
            return environment(url)
        case _:
            parts = [
                f"# pip: save as pip.conf (or point PIP_CONFIG_FILE at it)\n{pip_conf(url)}",
                f"# uv: save as uv.toml (or point UV_CONFIG_FILE at it)\n{uv_toml(url, channel)}",
                f"# environment (container images)\n{environment(url)}",
            ]
            return "\n".join(parts)
