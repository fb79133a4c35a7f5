"""drivetrain's benchmark suite: raw PyTorch, drivetrain, Lightning, Fabric and Accelerate side by side.

Run ``python -m benchmarks run [--quick]`` from the repository root; see ``benchmarks/README.md``.
"""
