"""Names the seeds use that Lightning retired, or that third-party packages provided, answer with history and replacement.

Each is tried as a user meets it: through both front doors, as an import, as a constructor
argument. docs/migrating-from-lightning.md lists the same names with the decision taken for each.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest

import drivetrain as dt
from drivetrain._utilities.registry import RetiredNameError
from drivetrain._utilities.retired import RenamedWarning
from drivetrain.strategies import DDPStrategy, Strategy, StrategyRegistry

#: strategy name -> (words of its history, the replacement the message must write).
STRATEGIES = {
    "dp": ("DataParallel", "strategy='ddp'"),
    "ddp2": ("removed in 1.8", "strategy='ddp'"),
    "ddp_sharded": ("FairScale", "strategy='fsdp'"),
    "ddp_sharded_spawn": ("FairScale", "strategy='fsdp'"),
    "ddp_fully_sharded": ("FairScale", "strategy='fsdp'"),
    "horovod": ("removed in Lightning 2.0", "strategy='ddp'"),
    "ipu_strategy": ("PopTorch is no longer maintained", "accelerator='auto'"),
    "tpu_spawn": ("renamed 'xla' in Lightning 2.0", "strategy='xla'"),
    "single_tpu": ("renamed 'single_xla'", "strategy='single_xla'"),
    "colossalai": ("lightning-colossalai", '[project.entry-points."drivetrain.strategies"] colossalai ='),
    "bagua": ("lightning-bagua", '[project.entry-points."drivetrain.strategies"] bagua ='),
    "hivemind": ("lightning-hivemind", '[project.entry-points."drivetrain.strategies"] hivemind ='),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("door", ["Trainer", "Accelerator"])
def test_retired_and_third_party_strategies_answer_with_history(name: str, door: str) -> None:
    history, replacement = STRATEGIES[name]
    with pytest.raises(RetiredNameError) as caught:
        getattr(dt, door)(strategy=name)
    message = str(caught.value)
    assert message.startswith(f"strategy={name!r}") and history in message and replacement in message
    assert "Did you mean" not in message and "Available:" not in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, KeyError)  # as before
    with pytest.raises(RetiredNameError, match=re.escape(history)):
        StrategyRegistry[name.upper()]  # Lightning's dict-style lookup, any case


def test_a_package_that_registers_a_third_party_name_makes_it_an_ordinary_strategy() -> None:
    class ColossalAIStrategy(DDPStrategy):
        @classmethod
        def register_strategies(cls, strategy_registry: Any) -> None:
            strategy_registry.register("colossalai", cls, description="a stand-in for the package's strategy")

    assert isinstance(dt.connect(accelerator="cpu", strategy="colossalai", devices=1), ColossalAIStrategy)


def test_ipu_accelerator_answers_with_history() -> None:
    for door in (dt.Trainer, dt.Accelerator):
        with pytest.raises(
            RetiredNameError, match=r"accelerator='ipu' \(Graphcore IPUs.*no longer maintained"
        ):
            door(accelerator="ipu")


def test_xla_debug_is_the_registered_preset_and_says_so_off_tpus() -> None:
    entry = StrategyRegistry.entry("xla_debug")
    assert entry.init_kwargs == {"debug": True}
    with pytest.raises(
        ValueError,
        match=r"^strategy='xla_debug' is the registered preset XLAStrategy\(debug=True\) \('xla' with torch_xla's "
        r"debug output\), which cannot run on CPUAccelerator: .*Use accelerator='xla' \(or 'tpu'\)",
    ):
        dt.Trainer(strategy="xla_debug")


@pytest.mark.parametrize(
    ("given", "modern"),
    [
        ({"gpus": 4, "precision": 16}, "Trainer(accelerator='gpu', devices=4, precision='16-mixed')"),
        ({"gpus": 0}, "Trainer(accelerator='cpu')"),
        ({"gpus": "0,1", "max_epochs": 3}, "Trainer(accelerator='gpu', devices='0,1', max_epochs=3)"),
        ({"tpu_cores": 8}, "Trainer(accelerator='tpu', devices=8)"),
        ({"hpus": 2}, "Trainer(accelerator='hpu', devices=2)"),
        ({"ipus": 8}, "Trainer(accelerator='auto')"),
        ({"num_processes": 2}, "Trainer(accelerator='cpu', devices=2)"),
    ],
)
def test_lightning_1_hardware_arguments_are_refused_with_the_modern_call(
    given: dict[str, Any], modern: str
) -> None:
    name = next(iter(given))
    with pytest.raises(
        TypeError, match=rf"^Trainer\({name}=.*removed in Lightning 2\.0.*{re.escape(modern)}"
    ):
        dt.Trainer(**given)


def test_precision_16_is_an_alias_of_16_mixed_with_a_warning() -> None:
    with pytest.warns(
        RenamedWarning, match=r"precision=16 is Lightning 1\.x's spelling .* use precision='16-mixed'"
    ):
        trainer = dt.Trainer(accelerator="cpu", precision=16, logger=False)
    assert trainer.precision == "16-mixed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dt.Trainer(accelerator="cpu", precision="16-mixed", logger=False).precision == "16-mixed"
        assert dt.Accelerator(cpu=True, mixed_precision="fp16").mixed_precision == "fp16"  # Accelerate's name


@pytest.mark.parametrize("module", ["drivetrain.plugins", "drivetrain.lightning_names"])
@pytest.mark.parametrize(
    ("name", "modern"),
    [
        ("DDPPlugin", "from drivetrain.strategies import DDPStrategy"),
        ("NativeMixedPrecisionPlugin", "precision='16-mixed'"),
    ],
)
def test_plugin_classes_whose_contract_changed_are_refused_with_the_modern_spelling(
    module: str, name: str, modern: str
) -> None:
    with pytest.raises(ImportError, match=rf"^{name}.* Lightning 1\.[x5].*{re.escape(modern)}"):
        exec(f"from {module} import {name}")


def test_plugin_classes_that_were_only_renamed_are_warned_aliases() -> None:
    from drivetrain.plugins import Precision

    with pytest.warns(
        RenamedWarning,
        match=r"TrainingTypePlugin is Lightning 1\.5's name .* drivetrain\.strategies\.Strategy",
    ):
        from drivetrain.lightning_names import TrainingTypePlugin
    with pytest.warns(RenamedWarning, match=r"use drivetrain\.plugins\.Precision"):
        from drivetrain.lightning_names import PrecisionPlugin
    assert TrainingTypePlugin is Strategy and PrecisionPlugin is Precision
    for name in ("TrainingTypePlugin", "PrecisionPlugin"):  # the plugins package says where they are
        with pytest.raises(ImportError, match=rf"^{name} is .* drivetrain\.lightning_names import {name}"):
            exec(f"from drivetrain.plugins import {name}")


def test_accelerators_holding_their_plugins_are_refused_with_the_modern_spelling() -> None:
    from drivetrain.accelerators import XPUAccelerator

    with pytest.raises(
        TypeError,
        match=r"^XPUAccelerator\(precision_plugin=\.\.\., training_type_plugin=\.\.\.\): in Lightning 1\.5 .*"
        r"strategy = CustomDDPStrategy\(accelerator=accelerator, precision_plugin=CustomPrecisionPlugin\(\)\)",
    ):
        XPUAccelerator(precision_plugin=object(), training_type_plugin=object())
    with pytest.raises(
        TypeError,
        match=r"^Accelerator\(precision_plugin=\.\.\.\) is Lightning 1\.5's way .*Accelerator\(precision=CustomPrecision\(\)",
    ):
        dt.Accelerator(precision_plugin=object())
