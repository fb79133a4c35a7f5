"""``drivetrain config`` and ``drivetrain launch`` with Accelerate's spellings, run as real commands.

The questions are answered through standard input; the file they write is what ``launch`` reads
by default; precision and accumulation steps reach the script's Accelerator and Trainer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from drivetrain.cli.main import main
from helpers.scripts import clean_env

SCRIPT = Path(__file__).parent / "launched_settings_script.py"
DRIVETRAIN = [sys.executable, "-m", "drivetrain"]


def _reports(out: Path) -> list[dict[str, object]]:
    reports = [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]
    for path in out.glob("rank*.json"):
        path.unlink()
    return reports


def _run(arguments: list[str], home: Path, stdin: str | None = None, timeout: float = 180):  # type: ignore[no-untyped-def]
    import subprocess

    env = clean_env(XDG_CONFIG_HOME=str(home))
    return subprocess.run(
        [*DRIVETRAIN, *arguments], input=stdin, capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.mark.multiprocess
def test_answers_to_config_become_the_defaults_of_launch_and_of_the_script(tmp_path: Path) -> None:
    # CPU only; 1 machine; a bad answer is asked again; 2 processes; bf16; 3 accumulation steps.
    answers = "yes\n\nmany\n2\nbf16\n3\n\n"
    written = _run(["config"], tmp_path, stdin=answers)
    assert written.returncode == 0, written.stderr
    assert "'many' is not a whole number; try again." in written.stdout
    path = tmp_path / "drivetrain" / "launch.yaml"
    assert f"wrote {path}" in written.stdout
    saved = yaml.safe_load(path.read_text())
    assert {k: v for k, v in saved.items() if v is not None} == {
        "use_cpu": True,
        "accelerator": "cpu",
        "num_machines": 1,
        "num_processes": 2,
        "mixed_precision": "bf16",
        "gradient_accumulation_steps": 3,
    }
    launched = _run(["launch", str(SCRIPT), str(tmp_path)], tmp_path)
    assert launched.returncode == 0, launched.stderr
    assert f"settings from {path}" in launched.stderr
    expected = {
        "world": 2,
        "device": "cpu",
        "mixed_precision": "bf16",
        "accumulation": 3,
        "trainer_precision": "bf16-mixed",
        "trainer_accumulation": 3,
        "warnings": [],
    }
    for report in (reports := _reports(tmp_path)):
        del report["master_addr"], report["master_port"]
    assert reports == [{"rank": r, **expected} for r in (0, 1)]
    # The command line wins over the file; the script's own settings win over both, with a warning.
    launched = _run(
        [
            "launch",
            "-n",  # torchrun's spelling: processes per node, over the file's total
            "1",
            "--mixed_precision",
            "fp16",
            str(SCRIPT),
            str(tmp_path),
            "explicit",
        ],
        tmp_path,
    )
    assert launched.returncode == 0, launched.stderr
    (report,) = _reports(tmp_path)
    assert (report["world"], report["mixed_precision"], report["accumulation"]) == (1, "no", 5)
    assert (report["trainer_precision"], report["trainer_accumulation"]) == ("32-true", 5)
    assert report["warnings"] == [
        "drivetrain launch (the DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS variable) asks for 3 batches per optimizer step, but the script sets accumulate_grad_batches=5",
        "drivetrain launch (the DRIVETRAIN_GRADIENT_ACCUMULATION_STEPS variable) asks for 3 batches per optimizer step, but the script sets gradient_accumulation_steps=5",
        "drivetrain launch (the DRIVETRAIN_PRECISION variable) asks for precision 'fp16', but the script sets '32-true'",
        "drivetrain launch (the DRIVETRAIN_PRECISION variable) asks for precision 'fp16', but the script sets 'no'",
    ]


@pytest.mark.multiprocess
def test_accelerate_spellings_and_an_accelerate_config_file(tmp_path: Path) -> None:
    config = tmp_path / "accelerate.yaml"
    # What `accelerate config` writes for two CPU processes.
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: MULTI_CPU\ndowncast_bf16: 'no'\n"
        "enable_cpu_affinity: false\nmachine_rank: 0\nmain_training_function: main\nmixed_precision: bf16\n"
        "num_machines: 1\nnum_processes: 2\nrdzv_backend: static\nsame_network: true\ntpu_env: []\n"
        "tpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: true\n"
    )
    launched = _run(
        [
            "launch",
            "--config_file",
            str(config),
            "--multi_gpu",
            "--gradient_accumulation_steps",
            "2",
            str(SCRIPT),
            str(tmp_path),
        ],
        tmp_path / "empty-home",
    )
    assert launched.returncode == 0, launched.stderr
    reports = _reports(tmp_path)
    assert [(r["world"], r["mixed_precision"], r["accumulation"], r["device"]) for r in reports] == [
        (2, "bf16", 2, "cpu")
    ] * 2
    # rdzv_backend: static (torchrun's default) does not pin the job to torchrun's fixed port
    # 29500: the single-node rendezvous is still drivetrain's own, on a free loopback port.
    assert {(r["master_addr"], r["master_port"] != "29500") for r in reports} == {("127.0.0.1", True)}


def test_config_default_writes_the_flags_without_asking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    target = tmp_path / "team.yaml"
    assert main(["config", "--default", "--config_file", str(target), "--num_processes", "4", "--cpu"]) == 0
    saved = yaml.safe_load(target.read_text())
    assert (saved["num_processes"], saved["use_cpu"], saved["mixed_precision"], saved["num_machines"]) == (
        4,
        True,
        "no",
        1,
    )
    assert not (tmp_path / "drivetrain" / "launch.yaml").exists()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            [
                "config",
                "--default",
                "--num_processes",
                "3",
                "--num_machines",
                "2",
                "--main_process_ip",
                "10.0.0.1",
            ],
            "cannot be shared equally by 2 machines",
        ),
        (["config", "--default", "--num_machines", "2", "--num_processes", "2"], "need main_process_ip"),
        (["config", "--default", "--mixed_precision", "fp4"], "mixed_precision"),
        (["config", "--default", "--cpu", "--accelerator", "cuda"], "--cpu asks for the CPU"),
        (
            ["config", "--default", "--gradient_accumulation_steps", "0"],
            "gradient_accumulation_steps must be an integer >= 1",
        ),
        (
            ["launch", "--num_processes", "3", "--num_machines", "2", "SCRIPT"],
            "cannot be shared equally by 2 nodes",
        ),
        (
            ["launch", "--num_processes", "2", "-n", "3", "SCRIPT"],
            "means 2 per node, but --nproc-per-node says 3",
        ),
        (["launch", "--cpu", "--accelerator", "cuda", "SCRIPT"], "--cpu asks for the CPU"),
        (
            ["launch", "--multi_gpu", "--num_processes", "1", "SCRIPT"],
            "--multi_gpu asks for several processes",
        ),
        (["launch", "--mixed_precision", "fp4", "SCRIPT"], "--mixed_precision"),
        (["launch", "--config_file", "missing.yaml", "SCRIPT"], "missing.yaml does not exist"),
    ],
)
def test_bad_settings_are_explained(
    arguments: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match=message):
        main([str(SCRIPT) if a == "SCRIPT" else a for a in arguments])


def test_a_config_file_with_settings_drivetrain_cannot_honour_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drivetrain.cli import launch_config

    path = tmp_path / "c.yaml"
    path.write_text(
        "num_processes: 2\ncompute_environment: AMAZON_SAGEMAKER\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
    )
    with pytest.raises(
        ValueError,
        match=r"cannot honour:\n  - compute_environment: 'AMAZON_SAGEMAKER': .*\n  - fsdp_config: FSDP is chosen by "
        r"the script in drivetrain: drivetrain.Accelerator\(strategy='fsdp'\)",
    ):
        launch_config.load(path)
    path.write_text("num_proceses: 2\n")
    with pytest.raises(ValueError, match="unknown setting 'num_proceses'"):
        launch_config.load(path)
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        launch_config.load(path)


def test_merge_weights_is_consolidate() -> None:
    from drivetrain.cli.main import build_parser

    parsed = build_parser().parse_args(["merge-weights", "src", "dst"])
    assert parsed.run.__name__ == "run_consolidate" and (parsed.source, parsed.destination) == ("src", "dst")


def test_stdin_closed_before_the_answers_is_explained(tmp_path: Path) -> None:
    result = _run(["config"], tmp_path, stdin="")
    assert result.returncode != 0
    assert "no answer (standard input closed)" in result.stderr


def test_the_command_line_wins_and_neutral_file_values_set_nothing(tmp_path: Path) -> None:
    from drivetrain.cli.launch import _with_config
    from drivetrain.cli.main import build_parser

    config = tmp_path / "c.yaml"
    config.write_text(
        "num_processes: 4\nmixed_precision: 'no'\ngradient_accumulation_steps: 1\nrdzv_backend: static\n"
    )
    args = _with_config(
        build_parser().parse_args(["launch", "--config_file", str(config), "-n", "2", str(SCRIPT)])
    )
    # -n (per node) replaces the file's total; "no"/1/"static" are every file's defaults: a script
    # that sets its own precision or accumulation gets no warning from them, and the rendezvous
    # stays drivetrain's loopback one.
    assert (args.nproc_per_node, args.num_processes) == ("2", None)
    assert (args.mixed_precision, args.gradient_accumulation_steps, args.rdzv_backend) == (None, None, None)


def test_num_processes_counts_every_machine() -> None:
    from drivetrain.cli.launch import _processes_per_node, torchrun_arguments
    from drivetrain.cli.main import build_parser

    args = build_parser().parse_args(
        [
            "launch",
            "--num_processes",
            "8",
            "--num_machines",
            "2",
            "--machine_rank",
            "1",
            "--main_process_ip",
            "10.0.0.1",
            "--main_process_port",
            "29400",
            "train.py",
            "--lr",
            "1",
        ]
    )
    per_node = _processes_per_node(args)
    assert per_node == 4
    assert torchrun_arguments(args, per_node) == [
        "--nproc-per-node=4",
        "--nnodes=2",
        "--node-rank=1",
        "--max-restarts=0",
        "--master-addr=10.0.0.1",
        "--master-port=29400",
        "train.py",
        "--lr",
        "1",
    ]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_dynamo_options_of_launch_compile_the_scripts_accelerator_models(tmp_path: Path) -> None:
    script = Path(__file__).parent / "launched_dynamo_script.py"
    config = tmp_path / "accelerate.yaml"
    # Accelerate's section for torch.compile; the command line wins over it.
    config.write_text(
        "num_processes: 2\nuse_cpu: true\ndynamo_config:\n  dynamo_backend: AOT_EAGER\n  dynamo_use_dynamic: true\n"
        "  dynamo_use_regional_compilation: false\n"
    )
    launched = _run(
        [
            "launch",
            "--config_file",
            str(config),
            "--dynamo_backend",
            "eager",
            "--dynamo_mode",
            "max-autotune",
            str(script),
            str(tmp_path),
        ],
        tmp_path / "empty-home",
    )
    assert launched.returncode == 0, launched.stderr
    expected = {
        "world": 2,
        "backend": "EAGER",
        "mode": "max-autotune",
        "fullgraph": False,
        "dynamic": True,
        "compiled": True,
        "wrapped": "DistributedDataParallel",
        "trainer_warned": True,
    }
    assert _reports(tmp_path) == [expected] * 2
    # One process (no DDP wrapper) compiles the whole model as one graph with --dynamo_use_fullgraph.
    launched = _run(
        [
            "launch",
            "--config_file",
            str(config),
            "-n",
            "1",
            "--dynamo_use_fullgraph",
            str(script),
            str(tmp_path),
        ],
        tmp_path / "empty-home",
    )
    assert launched.returncode == 0, launched.stderr
    expected.update(world=1, backend="AOT_EAGER", mode="default", fullgraph=True, wrapped="Linear")
    assert _reports(tmp_path) == [expected]


def test_a_dynamo_config_section_is_read_and_what_cannot_be_honoured_is_refused(tmp_path: Path) -> None:
    from drivetrain.cli import launch_config

    path = tmp_path / "c.yaml"
    path.write_text("dynamo_config:\n  dynamo_backend: AOT_EAGER\n  dynamo_use_fullgraph: false\n")
    loaded = launch_config.load(path)
    assert (loaded.dynamo_backend, loaded.dynamo_use_fullgraph, loaded.dynamo_mode) == (
        "AOT_EAGER",
        False,
        None,
    )
    path.write_text("dynamo_config:\n  dynamo_use_regional_compilation: true\n  dynamo_other: 1\n")
    with pytest.raises(
        ValueError,
        match=r"cannot honour:\n  - dynamo_config\.dynamo_use_regional_compilation: True: .*\n  - dynamo_config\.dynamo_other",
    ):
        launch_config.load(path)
    path.write_text("dynamo_mode: fastest\n")
    with pytest.raises(ValueError, match="dynamo_mode must be one of default"):
        launch_config.load(path)


def test_config_writes_the_dynamo_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "c.yaml"
    assert main(["config", "--default", "--config_file", str(target), "--dynamo_backend", "inductor"]) == 0
    assert yaml.safe_load(target.read_text())["dynamo_backend"] == "inductor"
    assert main(["config", "--default", "--config_file", str(target)]) == 0
    assert yaml.safe_load(target.read_text())["dynamo_backend"] is None
