"""Conda packages beside the wheels: a published wheel repackaged as a ``.conda`` package with
the metadata conda solvers select by, a local conda channel per variant, and a seeded
channel for machines that reach no conda host (the interpreter and the cell's wheels,
repackaged). py-rattler solves, indexes and installs; py-rattler-build writes packages."""
