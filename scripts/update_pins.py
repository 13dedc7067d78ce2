#!/usr/bin/env python3
"""Refresh the registry base pins of containers/pins.toml: resolve each base's tag (or a
new one, --tag) to the digest its registry serves now, and write it back.

Run it where the registries are reachable, review the diff, commit it: the builder images
are tagged by a hash of their pins, so the next build rebuilds exactly what changed.

    .venv/bin/python scripts/update_pins.py                 # every base, its current tag
    .venv/bin/python scripts/update_pins.py --base rocm --tag 6.4.1-complete
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wheelmill.errors import WheelmillError
from wheelmill.machine.pins import load_pins
from wheelmill.machine.registry import resolve_digest, rewrite_pin

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pins", type=Path, default=ROOT / "containers" / "pins.toml")
    parser.add_argument("--base", action="append", help="only this base (repeatable)")
    parser.add_argument("--tag", help="move the base to this tag (with one --base)")
    parser.add_argument("--dry-run", action="store_true", help="print, do not write")
    args = parser.parse_args(argv)
    try:
        pins = load_pins(args.pins)
        keys = args.base or sorted(pins.bases)
        if args.tag and len(keys) != 1:
            parser.error("--tag needs exactly one --base")
        for key in keys:
            base = pins.bases[key]
            tag = args.tag or base.tag
            digest = resolve_digest(base.image, tag)
            changed = False if args.dry_run else rewrite_pin(args.pins, key, digest=digest, tag=tag)
            print(f"{key}: {base.image}:{tag} -> {digest}{'' if changed or args.dry_run else ' (unchanged)'}")
    except WheelmillError as exc:
        print(f"update_pins: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyError as exc:
        print(f"update_pins: error: no base {exc} in {args.pins}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
