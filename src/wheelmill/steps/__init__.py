"""The steps of a build, each a small named function ``(run, [recipe,] log) -> checks``."""
