"""``drivetrain launch`` with the files ``accelerate config`` writes and the options ``accelerate launch`` takes.

The configuration files are written by the installed Accelerate's own config code
(``tests/compat/accelerate_configs.py``: ``accelerate config default`` and the questionnaire
answered for CPU, multi-CPU, multi-GPU, FSDP and DeepSpeed setups), not copied by hand. The
2-process launches run the Accelerate-style ``launched_accelerate_script.py``, which reports what it
was given after a real collective.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drivetrain.cli.main import build_parser, main
from helpers.scripts import clean_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))

import accelerate_configs
import accelerate_package

pytestmark = pytest.mark.compat

SCRIPT = Path(__file__).parent / "launched_accelerate_script.py"
DRIVETRAIN = [sys.executable, "-m", "drivetrain"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Setup name -> the file Accelerate's config code wrote for it."""
    package = accelerate_package.accelerate_package()
    return accelerate_configs.generate(package, tmp_path_factory.mktemp("accelerate-configs"))


def _launch(arguments: list[str], home: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = clean_env(XDG_CONFIG_HOME=str(home))
    return subprocess.run(
        [*DRIVETRAIN, "launch", *arguments], capture_output=True, text=True, env=env, timeout=timeout
    )


def _reports(out: Path) -> list[dict[str, object]]:
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]


def test_the_files_are_accelerates(files: dict[str, Path]) -> None:
    # What the questionnaire answers asked for is in the files (the answers reached the right questions).
    read = {name: yaml.safe_load(path.read_text()) for name, path in files.items()}
    assert (
        read["default"]["use_cpu"],
        read["default"]["same_network"],
        read["default"]["num_processes"],
    ) == (
        True,
        False,
        1,
    )
    assert (read["cpu"]["distributed_type"], read["cpu"]["use_cpu"]) == ("NO", True)
    assert (read["multi_cpu"]["distributed_type"], read["multi_cpu"]["num_processes"]) == ("MULTI_CPU", 2)
    assert (read["multi_cpu_debug_bf16"]["debug"], read["multi_cpu_debug_bf16"]["mixed_precision"]) == (
        True,
        "bf16",
    )
    assert (read["multi_gpu"]["distributed_type"], read["multi_gpu"]["gpu_ids"]) == ("MULTI_GPU", "all")
    assert (read["fsdp"]["distributed_type"], read["fsdp"]["fsdp_config"]["fsdp_version"]) == ("FSDP", 2)
    assert (read["deepspeed"]["distributed_type"], read["deepspeed"]["deepspeed_config"]["zero_stage"]) == (
        "DEEPSPEED",
        2,
    )


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_accelerate_config_default_with_every_accelerate_launch_option(
    files: dict[str, Path], tmp_path: Path
) -> None:
    # The file `accelerate config default` writes (same_network: false, debug: false …), and the
    # options of `accelerate launch`, all at once; --no_python runs an executable wrapper.
    wrapper = tmp_path / "train"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SCRIPT}" "$@"\n')
    wrapper.chmod(0o755)
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    launched = _launch(
        [
            "--config_file",
            str(files["default"]),
            "--num_processes",
            "2",
            "--monitor_interval",
            "0.2",
            "--max_restarts",
            "0",
            "--num_cpu_threads_per_process",
            "1",
            "--same_network",
            "--debug",
            "--tee",
            "3",
            "--log_dir",
            str(logs),
            "--enable_cpu_affinity",
            "--gpu_ids",
            "0",
            "--downcast_bf16",
            "--quiet",
            "--no_python",
            str(wrapper),
            str(out),
        ],
        tmp_path / "home",
    )
    assert launched.returncode == 0, launched.stderr
    reports = _reports(out)
    assert [(r["ranks"], r["world"], r["device"], r["debug"], r["threads"], r["entry"]) for r in reports] == [
        ([0, 1], 2, "cpu", True, 1, "main")
    ] * 2
    assert reports[0]["variables"] == {
        "CUDA_VISIBLE_DEVICES": "0",
        "XLA_DOWNCAST_BF16": "1",
        "OMP_NUM_THREADS": "1",
    }
    # --tee 3 --log_dir: each rank's output is in its own file too.
    logged = sorted(path.read_text() for path in logs.rglob("stdout.log"))
    assert logged == ["rank 0 reported\n", "rank 1 reported\n"]
    # Options that change nothing on this hardware say so (never silently).
    assert "--enable_cpu_affinity binds each process" in launched.stderr
    assert "--downcast_bf16 is read by torch_xla only" in launched.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_questionnaire_files_for_cpu_and_multi_cpu_launch_two_processes(
    files: dict[str, Path], tmp_path: Path
) -> None:
    # The CPU file (one process) with --num_processes 2 and a training function called by name.
    out = tmp_path / "cpu"
    out.mkdir()
    launched = _launch(
        [
            "--config_file",
            str(files["cpu"]),
            "--num_processes",
            "2",
            "--main_training_function",
            "train",
            str(SCRIPT),
            str(out),
        ],
        tmp_path / "home",
    )
    assert launched.returncode == 0, launched.stderr
    assert [(r["ranks"], r["entry"], r["name"], r["debug"]) for r in _reports(out)] == [
        ([0, 1], "train", "launched_accelerate_script", False)
    ] * 2
    # The multi-CPU file with the collective checks (debug: true) and bf16 asked for.
    out = tmp_path / "multi_cpu"
    out.mkdir()
    launched = _launch(
        ["--config_file", str(files["multi_cpu_debug_bf16"]), str(SCRIPT), str(out)], tmp_path / "home"
    )
    assert launched.returncode == 0, launched.stderr
    assert [(r["ranks"], r["mixed_precision"], r["debug"], r["entry"]) for r in _reports(out)] == [
        ([0, 1], "bf16", True, "main")
    ] * 2


def _with_config(arguments: list[str]):  # type: ignore[no-untyped-def]
    from drivetrain.cli.launch import _with_config

    return _with_config(build_parser("launch").parse_args(["launch", *arguments, str(SCRIPT)]))


def test_gpu_and_multi_cpu_files_are_read_as_written(files: dict[str, Path]) -> None:
    gpu = _with_config(["--config_file", str(files["multi_gpu"])])
    assert (gpu.num_processes, gpu.mixed_precision, gpu.cpu, gpu.gpu_ids, gpu.debug) == (
        2,
        "fp16",
        False,
        "all",
        None,
    )
    cpu = _with_config(["--config_file", str(files["multi_cpu"])])
    assert (cpu.num_processes, cpu.cpu, cpu.mixed_precision, cpu.same_network) == (2, True, None, True)


@pytest.mark.parametrize(
    ("setup", "advice"),
    [
        (
            "fsdp",
            r"distributed_type: FSDP with fsdp_config: FSDP is chosen by the script in drivetrain: "
            r"drivetrain.Accelerator\(strategy='fsdp'\)",
        ),
        (
            "deepspeed",
            r"distributed_type: DEEPSPEED with deepspeed_config: DeepSpeed is chosen by the script in "
            r"drivetrain: drivetrain.Accelerator\(strategy='deepspeed_stage_2'\)",
        ),
    ],
)
def test_fsdp_and_deepspeed_files_name_the_strategy_the_script_passes(
    files: dict[str, Path], setup: str, advice: str
) -> None:
    with pytest.raises(SystemExit, match=advice):
        _with_config(["--config_file", str(files[setup])])


def test_sections_left_empty_or_switched_off_are_accepted(files: dict[str, Path], tmp_path: Path) -> None:
    # What users keep in their files (and older Accelerate wrote for every CPU setup).
    data = yaml.safe_load(files["multi_cpu"].read_text())
    data.update(
        deepspeed_config={},
        fsdp_config={},
        megatron_lm_config={},
        ipex_config={"ipex": False},
        mpirun_config={},
    )
    path = tmp_path / "kept.yaml"
    path.write_text(yaml.safe_dump(data))
    assert _with_config(["--config_file", str(path)]).num_processes == 2
    # A section switched on gets advice that fits it.
    data["ipex_config"] = {"ipex": True}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        SystemExit, match="ipex_config: drivetrain has no Intel Extension for PyTorch integration"
    ):
        _with_config(["--config_file", str(path)])


@pytest.mark.parametrize(
    ("flag", "advice"),
    [
        ("--use_deepspeed", "--use_deepspeed is chosen by the script in drivetrain: strategy='deepspeed'"),
        ("--use_fsdp", "--use_fsdp is chosen by the script in drivetrain: strategy='fsdp'"),
    ],
)
def test_strategy_flags_name_what_the_script_passes(
    flag: str, advice: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match=advice):
        main(["launch", flag, "--num_processes", "2", str(SCRIPT)])


def test_options_become_torchrun_arguments() -> None:
    from drivetrain.cli.launch import torchrun_arguments

    args = build_parser("launch").parse_args(
        [
            "launch",
            "--monitor_interval",
            "0.5",
            "--tee",
            "0:3,1:1",
            "--log_dir",
            "logs",
            "--module",
            "pkg.train",
        ]
    )
    assert torchrun_arguments(args, 2)[4:] == [
        "--monitor-interval=0.5",
        "--tee=0:3,1:1",
        "--log-dir=logs",
        "-m",
        "pkg.train",
    ]
    # Machines not on one network meet at the dynamic rendezvous's endpoint on machine 0 (as
    # accelerate launch), not at torchrun's default endpoint on each machine itself.
    args = build_parser("launch").parse_args(
        [
            "launch",
            "--num_processes",
            "4",
            "--num_machines",
            "2",
            "--main_process_ip",
            "10.0.0.1",
            "--rdzv_backend",
            "c10d",
            "train.py",
        ]
    )
    assert torchrun_arguments(args, 2)[4:] == [
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29500",
        "train.py",
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--tee", "4"], "--tee takes 0"),
        (["--gpu_ids", "0;1"], "gpu_ids must be 'all' or device numbers"),
        (["--num_cpu_threads_per_process", "0"], "--num_cpu_threads_per_process must be at least 1"),
        (["--no_python", "--main_training_function", "train"], "--no_python runs the script as a program"),
        (["--main_training_function", "not-a-name"], "must be a function's name"),
    ],
)
def test_bad_options_are_explained(
    arguments: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match=message):
        main(["launch", *arguments, str(SCRIPT)])


def test_config_default_writes_a_basic_file_and_never_replaces_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert main(["config", "default", "--mixed_precision", "bf16"]) == 0
    written = tmp_path / "drivetrain" / "launch.yaml"
    saved = yaml.safe_load(written.read_text())
    # This machine has no accelerator: one CPU process, as accelerate config default writes.
    assert (saved["num_processes"], saved["use_cpu"], saved["mixed_precision"]) == (1, True, "bf16")
    assert _with_config([]).mixed_precision == "bf16"  # drivetrain launch reads it by default
    before = written.read_text()
    assert main(["config", "default", "--mixed_precision", "fp16"]) == 0
    assert written.read_text() == before
    assert "exists and is left as it is" in capsys.readouterr().out


def test_a_missing_training_function_is_named(tmp_path: Path) -> None:
    from drivetrain.cli.run_function import main as run_function

    script = tmp_path / "job.py"
    script.write_text("def train():\n    pass\n\ndef evaluate():\n    pass\n")
    with pytest.raises(
        SystemExit, match=r"job.py has no function of that name \(its functions: evaluate, train\)"
    ):
        run_function([str(script), "fit"])


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_quiet_leaves_out_torchruns_report_of_a_failure(tmp_path: Path) -> None:
    reports = {}
    for quiet in (False, True):
        out = tmp_path / f"quiet-{quiet}"
        out.mkdir()
        options = ["--quiet"] if quiet else []
        launched = _launch(["-n", "2", "--cpu", *options, str(SCRIPT), str(out), "fail"], tmp_path / "home")
        assert launched.returncode == 1
        assert "rank 1 failed on purpose" in launched.stderr  # the failing rank's own error
        assert "drivetrain launch: " in launched.stderr and "failed: rank 1" in launched.stderr
        reports[quiet] = "failed (exitcode: " in launched.stderr  # torchrun's agent log line
    assert reports == {False: True, True: False}
