"""DeepSpeedStrategy without processes: config building, "auto" filling, contradictions, missing package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain._utilities.imports import package_available
from drivetrain.strategies import deepspeed_config as cfg

needs_deepspeed = pytest.mark.skipif(not package_available("deepspeed"), reason="needs the deepspeed extra")


def test_offload_settings_that_contradict_the_stage_are_errors() -> None:
    with pytest.raises(ValueError, match=r"Parameter offload .* needs ZeRO stage 3, but the stage is 2"):
        cfg.check_zero_settings({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})
    with pytest.raises(
        ValueError, match=r"Optimizer offload .* needs ZeRO stage 1, 2 or 3, but the stage is 0"
    ):
        cfg.check_zero_settings({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    cfg.check_zero_settings({"zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}})
    with pytest.raises(ValueError, match=r"stage=4 is not a ZeRO stage"):
        cfg.check_arguments(
            stage=4, offload_optimizer=False, offload_parameters=False, offload_device="cpu", nvme_path=None
        )
    with pytest.raises(ValueError, match=r"offload_device='nvme' needs nvme_path"):
        cfg.check_arguments(
            stage=3, offload_optimizer=True, offload_parameters=False, offload_device="nvme", nvme_path=None
        )
    with pytest.raises(ValueError, match=r"nvme_path='/x' is only used with offload_device='nvme'"):
        cfg.check_arguments(
            stage=3, offload_optimizer=True, offload_parameters=False, offload_device="cpu", nvme_path="/x"
        )


def test_batch_sizes_are_filled_and_checked() -> None:
    config: dict = {"train_micro_batch_size_per_gpu": "auto"}
    cfg.fill_batch_sizes(config, micro_batch_size=8, world_size=2)
    assert (
        config["train_micro_batch_size_per_gpu"],
        config["gradient_accumulation_steps"],
        config["train_batch_size"],
    ) == (8, 1, 16)
    config = {"train_batch_size": 32, "gradient_accumulation_steps": 4}
    cfg.fill_batch_sizes(config, micro_batch_size=None, world_size=2)
    assert config["train_micro_batch_size_per_gpu"] == 4
    with pytest.raises(ValueError, match=r"train_batch_size = .* but 10 != 4 x 1 x 2"):
        cfg.fill_batch_sizes(
            {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, micro_batch_size=None, world_size=2
        )


def test_precision_fills_auto_and_contradictions_are_errors() -> None:
    config: dict = {"bf16": {"enabled": "auto"}}
    assert cfg.fill_precision(config, "bf16-mixed") == "bf16-mixed"
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    forced: dict = {"fp16": {"enabled": True, "loss_scale": 0}}
    assert cfg.fill_precision(forced, "32-true") == "16-mixed"  # the config wins over the default
    assert forced["fp16"] == {"enabled": True, "loss_scale": 0}
    with pytest.raises(ValueError, match=r"config enables fp16, but precision='bf16-mixed'"):
        cfg.fill_precision({"fp16": {"enabled": True}}, "bf16-mixed")
    with pytest.raises(ValueError, match=r"config disables bf16, but precision='bf16-true' needs it"):
        cfg.fill_precision({"bf16": {"enabled": False}}, "bf16-true")
    with pytest.raises(ValueError, match=r"enables both bf16 and fp16"):
        cfg.fill_precision({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "32-true")


def test_defaults_and_leftover_auto_values() -> None:
    config: dict = {"gradient_clipping": "auto", "zero_allow_untested_optimizer": False}
    cfg.fill_defaults(config)
    assert config["gradient_clipping"] == 0.0 and config["zero_allow_untested_optimizer"] is False
    assert config["zero_force_ds_cpu_optimizer"] is False
    unset: dict = {}
    cfg.fill_defaults(unset)
    assert unset["gradient_clipping"] == 0.0  # DeepSpeed's own default (1.0) would clip silently
    with pytest.raises(ValueError, match=r"still has 'auto' at optimizer.params.lr"):
        cfg.fill_defaults({"optimizer": {"type": "Adam", "params": {"lr": "auto"}}})


def test_user_config_from_a_file_or_dict(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert cfg.load_user_config(path) == {"zero_optimization": {"stage": 3}}
    original = {"zero_optimization": {"stage": 1}}
    copy = cfg.load_user_config(original)
    copy["zero_optimization"]["stage"] = 2
    assert original["zero_optimization"]["stage"] == 1  # the user's dict is never modified
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"is not valid JSON"):
        cfg.load_user_config(path)
    with pytest.raises(TypeError, match=r"config= expects a dict or the path of a JSON file, got int"):
        cfg.load_user_config(3)  # type: ignore[arg-type]


@needs_deepspeed
def test_strategy_arguments_and_presets() -> None:
    import drivetrain as dt
    from drivetrain.accelerators import MPSAccelerator, XLAAccelerator
    from drivetrain.plugins import DeepSpeedPrecision
    from drivetrain.strategies import DeepSpeedStrategy, StrategyRegistry

    presets = {"deepspeed", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload",
               "deepspeed_stage_3", "deepspeed_stage_3_offload"}  # fmt: skip
    assert presets <= set(StrategyRegistry.available_strategies())
    with pytest.raises(ValueError, match=r"got config= and also stage=, offload_optimizer="):
        DeepSpeedStrategy(stage=3, offload_optimizer=True, config={"zero_optimization": {"stage": 3}})
    with pytest.raises(ValueError, match=r"Parameter offload .* needs ZeRO stage 3"):
        DeepSpeedStrategy(stage=2, offload_parameters=True)
    for accelerator in (MPSAccelerator(), XLAAccelerator()):
        with pytest.raises(
            ValueError, match=rf"DeepSpeedStrategy cannot run on {type(accelerator).__name__}"
        ):
            DeepSpeedStrategy().check_accelerator(accelerator)

    strategy = dt.connect(accelerator="cpu", strategy="deepspeed_stage_3", devices=2, precision="bf16-mixed")
    assert isinstance(strategy, DeepSpeedStrategy) and strategy.stage == 3 and strategy.requires_joint_setup
    assert isinstance(strategy.precision, DeepSpeedPrecision) and strategy.config["bf16"] == {"enabled": True}
    with pytest.warns(UserWarning, match=r"DeepSpeed CPU offload on the CPU accelerator moves nothing"):
        offload = dt.connect(accelerator="cpu", strategy="deepspeed_stage_3_offload", devices=2)
    assert offload.config["zero_optimization"]["offload_param"]["device"] == "cpu"
    with pytest.raises(ValueError, match=r"DeepSpeed cannot train with precision='64-true'"):
        dt.connect(accelerator="cpu", strategy="deepspeed", devices=2, precision="64-true")
    forced = dt.connect(
        accelerator="cpu", strategy=DeepSpeedStrategy(config={"bf16": {"enabled": True}}), devices=2
    )
    assert forced.precision.name == "bf16-mixed"  # the config's bf16 wins over the default 32-true
    with pytest.raises(
        ValueError, match=r"clips gradients inside its step, by the 2-norm in its config.s gradient_clipping"
    ):
        strategy.clip_gradients_norm(None, None, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"cannot clip gradients by value"):
        strategy.clip_gradients_value(None, None, 1.0)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"ZeRO stage 3 reduces and partitions gradients .* gradient_accumulation_steps"
    ):
        strategy.no_backward_sync(None)  # type: ignore[arg-type]


_HIDE_DEEPSPEED = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "deepspeed" or name.startswith("deepspeed."):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
import drivetrain as dt
try:
    dt.connect(accelerator="cpu", strategy="deepspeed_stage_2", devices=2)
except ImportError as error:
    print(type(error).__name__, error)
"""


def test_missing_deepspeed_says_how_to_install_it() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _HIDE_DEEPSPEED], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "MissingDependencyError" in result.stdout
    assert "pip install 'drivetrain[deepspeed]'" in result.stdout
