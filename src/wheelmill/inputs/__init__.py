"""What a build is made of, as files say it: the matrix, the recipes, versions, selection.

The JSON schemas these files are checked against belong to wheelmill (``SCHEMAS``), not to a
recipes directory: a team keeping its recipes in a repository of its own needs none of them.
"""

from pathlib import Path

SCHEMAS = Path(__file__).resolve().parent / "schema"

# A bare --rebuild: every recipe of the cell, built again though published. Here, where the
# command line takes it without loading the matrix (wheelmill.cli: a command's start).
REBUILD_ALL = "*"
