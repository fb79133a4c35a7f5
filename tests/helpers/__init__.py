"""Shared test helpers (importable as ``helpers`` thanks to tests/conftest.py)."""
