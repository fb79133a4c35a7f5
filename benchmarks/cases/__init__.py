"""The benchmark cases: one package per case, holding its definition and one script per variant."""
