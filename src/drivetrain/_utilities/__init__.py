"""Small internal helpers shared by every layer: registries, nested-data traversal, seeding, rank-zero output.

Not a public API (``drivetrain.utils`` is the public, Accelerate-compatible one). Import from the
modules themselves; the package imports nothing, so using one helper does not load the others.
"""
