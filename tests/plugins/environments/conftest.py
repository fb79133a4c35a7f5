"""Every cluster-environment test starts from an environment with no launcher variables at all."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

# Everything any environment reads, so the machine's own job (a CI runner inside SLURM, say)
# cannot leak into a test.
_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "LSB_", "JSM_", "TORCHELASTIC_", "KUBERNETES_")
_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
)


@pytest.fixture(autouse=True)
def _clean_cluster_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in _NAMES or name.startswith(_PREFIXES):
            monkeypatch.delenv(name)


@pytest.fixture
def setenv(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``setenv(RANK=1, MASTER_ADDR="host")``: set several variables (values turned into strings)."""

    def apply(**variables: object) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, str(value))

    return apply
