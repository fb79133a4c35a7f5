"""drivetrain's own plugins pass the conformance kit.

In CI, every built-in accelerator, strategy, precision, checkpoint IO and cluster environment passes
the contract checks (seconds in all; CUDA, XPU, MPS, XLA and HPU fake, against the kit's stand-ins),
and a representative subset runs the whole programs: the HPU accelerator on its stand-in (both front
doors, 1 and 2 processes, save → kill → resume, the CLI and ``drivetrain launch``) and the SLURM
environment with the kit as its scheduler. ``scripts/check-plugins`` runs the whole programs for every
built-in (docs/writing-a-plugin.md says which runs where); CUDA runs for real where a GPU is present.
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest
import torch

from drivetrain._utilities.imports import package_available
from drivetrain.testing import (
    Report,
    Status,
    check_accelerator,
    check_checkpoint_io,
    check_cluster_environment,
    check_precision,
    check_strategy,
)


def _all_pass(report: Report) -> None:
    """Every row passed or is not applicable with a reason."""
    assert report.ok, report.table()
    for row in report:
        assert row.status is Status.PASSED or row.reason, f"{row.name} is not applicable without a reason"


@pytest.mark.parametrize(
    ("name", "fake"),
    [("cpu", False), ("cuda", True), ("xpu", True), ("mps", True), ("xla", True), ("hpu", True)],
)
def test_builtin_accelerators_pass_the_contract(name: str, fake: bool) -> None:
    report = check_accelerator(name, fake=fake, whole_programs=False)
    _all_pass(report)
    rng = report.row("accelerator: random generators saved and restored")
    assert rng.status is (Status.NOT_APPLICABLE if name == "cpu" else Status.PASSED), report.table()


#: strategy name -> (the accelerator it runs on, fake).
STRATEGIES: dict[str, tuple[str, bool]] = {
    "single_device": ("cpu", False),
    "ddp": ("cpu", False),
    "ddp_spawn": ("cpu", False),
    "ddp_fork": ("cpu", False),
    "ddp_notebook": ("cpu", False),
    "ddp_find_unused_parameters_true": ("cpu", False),
    "fsdp": ("cpu", False),
    "fsdp_cpu_offload": ("cpu", False),
    "model_parallel": ("cpu", False),
    "xla": ("xla", True),
    "xla_debug": ("xla", True),
    "single_xla": ("xla", True),
    "hpu_single": ("hpu", True),
    "hpu_parallel": ("hpu", True),
}
DEEPSPEED = [
    "deepspeed",
    "deepspeed_stage_1",
    "deepspeed_stage_2",
    "deepspeed_stage_3",
    "deepspeed_stage_2_offload",
]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_builtin_strategies_pass_the_contract(name: str) -> None:
    accelerator, fake = STRATEGIES[name]
    _all_pass(check_strategy(name, accelerator=accelerator, fake=fake, whole_programs=False))


@pytest.mark.deepspeed
@pytest.mark.skipif(not package_available("deepspeed"), reason="needs the deepspeed extra")
@pytest.mark.parametrize("name", DEEPSPEED)
def test_deepspeed_strategies_pass_the_contract(name: str) -> None:
    _all_pass(check_strategy(name, whole_programs=False))


@pytest.mark.parametrize("name", ["64-true", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"])
def test_builtin_precisions_pass_the_contract(name: str) -> None:
    report = check_precision(name, whole_programs=False)
    _all_pass(report)
    skips = report.row("precision: a step with inf gradients is skipped")
    assert skips.status is (Status.PASSED if name == "16-mixed" else Status.NOT_APPLICABLE), report.table()


@pytest.mark.parametrize(
    "io", ["drivetrain.plugins:TorchCheckpointIO", "drivetrain.plugins:AsyncCheckpointIO"]
)
def test_builtin_checkpoint_ios_pass_the_contract(io: str, tmp_path: Path) -> None:
    _all_pass(check_checkpoint_io(io, tmp_path, whole_programs=False))


def test_the_contract_without_a_folder_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It writes into one temporary folder and removes it; each check used to make another, left empty.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _all_pass(check_checkpoint_io("drivetrain.plugins:TorchCheckpointIO", whole_programs=False))
    assert list(tmp_path.iterdir()) == []


def _lsf_hosts() -> str:
    return f"launchnode 1 {socket.gethostname()} 2"


#: environment -> the variables its scheduler sets for each process.
ENVIRONMENTS: dict[str, dict[str, str]] = {
    "LocalEnvironment": {
        "RANK": "{rank}",
        "WORLD_SIZE": "{world_size}",
        "LOCAL_RANK": "{rank}",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "{port}",
    },
    "TorchElasticEnvironment": {
        "TORCHELASTIC_RUN_ID": "kit",
        "RANK": "{rank}",
        "LOCAL_RANK": "{local_rank}",
        "WORLD_SIZE": "{world_size}",
        "LOCAL_WORLD_SIZE": "{world_size}",
        "GROUP_RANK": "{node_rank}",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "{port}",
    },
    "SLURMEnvironment": {
        "SLURM_NTASKS": "{world_size}",
        "SLURM_PROCID": "{rank}",
        "SLURM_LOCALID": "{local_rank}",
        "SLURM_NODEID": "{node_rank}",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": "{world_size}",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "train",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "{port}",
    },
    "KubeflowEnvironment": {
        "KUBERNETES_PORT": "tcp://10.0.0.1:443",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "{port}",
        "WORLD_SIZE": "{world_size}",
        "RANK": "{rank}",
    },
    "MPIEnvironment": {
        "OMPI_COMM_WORLD_SIZE": "{world_size}",
        "OMPI_COMM_WORLD_RANK": "{rank}",
        "OMPI_COMM_WORLD_LOCAL_RANK": "{local_rank}",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "{world_size}",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "{port}",
    },
    "LSFEnvironment": {
        "LSB_JOBID": "4242",
        "LSB_MCPU_HOSTS": _lsf_hosts(),
        "JSM_NAMESPACE_SIZE": "{world_size}",
        "JSM_NAMESPACE_RANK": "{rank}",
        "JSM_NAMESPACE_LOCAL_RANK": "{local_rank}",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "{port}",
    },
}


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_builtin_environments_pass_the_contract(name: str) -> None:
    _all_pass(
        check_cluster_environment(f"drivetrain.plugins:{name}", ENVIRONMENTS[name], whole_programs=False)
    )


# -- whole programs, a representative subset ----------------------------------------------------------------
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_hpu_on_its_stand_in_runs_both_doors_and_resumes_bit_exactly_on_one_and_two_processes(
    tmp_path: Path,
) -> None:
    report = check_accelerator("hpu", fake=True, root=tmp_path)
    _all_pass(report)
    for world in ("1 process", "2 processes"):
        for door in ("Trainer", "Accelerator"):
            resumed = (
                "save, kill, resume bit-exactly"
                if door == "Trainer"
                else "save_state, kill, load_state bit-exactly"
            )
            assert report.row(f"{door}, {world}: {resumed}").passed
        assert report.row(f"{world}: accelerator='hpu' in every process").passed
        assert report.row(f"{world}: the hooks drivetrain calls on the accelerator").passed
    assert report.row(
        "2 processes: the strategy's collectives (all_reduce, all_gather, broadcast, barrier …)"
    ).passed
    assert report.row("CLI: python train.py fit --trainer.accelerator=hpu --trainer.devices=2").passed
    # The programs ran the HPU strategies (hpu_single on one card, hpu_parallel over HCCL on two).
    strategies = {
        world: torch.load(
            tmp_path / "accelerator" / f"{world}-process" / "results" / "trainer-first-rank0.pt",
            weights_only=True,
        )["strategy"]
        for world in (1, 2)
    }
    assert strategies == {1: "SingleHPUStrategy", 2: "HPUParallelStrategy"}


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_slurm_environment_runs_both_doors_with_the_kit_as_its_scheduler(tmp_path: Path) -> None:
    report = check_cluster_environment(
        "drivetrain.plugins:SLURMEnvironment", ENVIRONMENTS["SLURMEnvironment"], root=tmp_path
    )
    _all_pass(report)
    assert report.row("Trainer, 2 processes: save, kill, resume bit-exactly").passed
    assert report.row("Accelerator, 2 processes: save_state, kill, load_state bit-exactly").passed


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.timeout(900)
def test_cuda_passes_the_kit_for_real(tmp_path: Path) -> None:
    devices = min(2, torch.cuda.device_count())
    report = check_accelerator("cuda", devices=devices, root=tmp_path)
    _all_pass(report)
    assert report.row("Trainer, 1 process: save, kill, resume bit-exactly").passed


def test_full_run_covers_each_builtin() -> None:
    """scripts/check-plugins lists every built-in that the contract tests above cover."""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "check-plugins").read_text()
    for name in [
        *STRATEGIES,
        "cpu",
        "cuda",
        "xpu",
        "mps",
        "xla",
        "hpu",
        "TorchCheckpointIO",
        "AsyncCheckpointIO",
        *ENVIRONMENTS,
    ]:
        assert name in script, f"scripts/check-plugins does not run {name}"
