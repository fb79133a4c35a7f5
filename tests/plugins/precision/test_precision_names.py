"""Precision names: canonical names, accepted spellings, the registry and precision_from_name."""

from __future__ import annotations

import pytest
import torch

from drivetrain.plugins.precision import (
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    PrecisionRegistry,
    canonical_precision,
    precision_from_name,
)

CANONICAL = ["64-true", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"]

ALIASES = [
    ("no", "32-true"),
    ("fp16", "16-mixed"),
    ("bf16", "bf16-mixed"),
    (64, "64-true"),
    (32, "32-true"),
    (16, "16-mixed"),
    ("64", "64-true"),
    ("32", "32-true"),
    ("16", "16-mixed"),
    ("fp32", "32-true"),
    ("fp64", "64-true"),
]


@pytest.mark.parametrize("name", CANONICAL)
def test_canonical_names_map_to_themselves(name):
    assert canonical_precision(name) == name


@pytest.mark.parametrize(("alias", "expected"), ALIASES)
def test_accepted_spellings_map_to_canonical_names(alias, expected):
    assert canonical_precision(alias) == expected


@pytest.mark.parametrize("value", ["fp4", "bf16-true-ish", "", "BF16", 8, 0])
def test_unknown_precision_lists_the_accepted_spellings(value):
    with pytest.raises(ValueError, match="Unknown precision") as excinfo:
        canonical_precision(value)
    message = str(excinfo.value)
    assert repr(value) in message
    assert "'bf16-mixed'" in message and "'fp16'" in message


@pytest.mark.parametrize("value", [True, False, 16.0, None, torch.float16, ["16-mixed"]])
def test_wrong_types_are_type_errors(value):
    with pytest.raises(TypeError, match="precision is given as a string"):
        canonical_precision(value)
    with pytest.raises(TypeError):
        precision_from_name(value, "cpu")


def test_registry_holds_the_canonical_names_with_descriptions():
    assert set(CANONICAL) <= set(PrecisionRegistry.available())
    for name in CANONICAL:
        assert PrecisionRegistry.entry(name).description


EXPECTED = {
    "64-true": (DoublePrecision, torch.float64),
    "32-true": (Precision, None),
    "16-mixed": (MixedPrecision, torch.float16),
    "bf16-mixed": (MixedPrecision, torch.bfloat16),
    "16-true": (HalfPrecision, torch.float16),
    "bf16-true": (HalfPrecision, torch.bfloat16),
}


@pytest.mark.parametrize("value", CANONICAL + [alias for alias, _ in ALIASES])
def test_precision_from_name_builds_the_right_plugin(value):
    plugin = precision_from_name(value, "cpu")
    name = canonical_precision(value)
    cls, dtype = EXPECTED[name]
    assert type(plugin) is cls
    assert plugin.name == name
    if dtype is not None:
        assert plugin.dtype == dtype
    if isinstance(plugin, MixedPrecision):
        assert plugin.device == "cpu"
        assert (plugin.scaler is not None) == (name == "16-mixed")


def test_precision_from_name_reports_unknown_names_with_the_registered_ones():
    with pytest.raises(ValueError, match="Unknown precision 'fp4'") as excinfo:
        precision_from_name("fp4", "cpu")
    assert "bf16-true" in str(excinfo.value)


class _Fp8Precision(Precision):
    name = "fp8-custom"

    def __init__(self, margin: int = 0) -> None:
        self.margin = margin


class _DevicePrecision(Precision):
    def __init__(self, device: str = "nowhere") -> None:
        self.device = device


@pytest.fixture
def registered():
    names = []

    def register(name, cls, **kwargs):
        PrecisionRegistry.register(name, cls, description="test", **kwargs)
        names.append(name)

    yield register
    for name in names:
        PrecisionRegistry.remove(name)


def test_user_registered_names_work_through_precision_from_name(registered):
    registered("fp8-custom", _Fp8Precision, margin=3)
    registered("needs-device", _DevicePrecision)
    plugin = precision_from_name("fp8-custom", "cuda")  # no ``device`` parameter: not passed
    assert type(plugin) is _Fp8Precision and plugin.margin == 3
    assert precision_from_name("needs-device", "xpu").device == "xpu"
    with pytest.raises(ValueError, match="fp8-custom"):  # listed among the registered names
        precision_from_name("fp9", "cpu")


def test_an_unknown_precision_lists_each_spelling_once(registered) -> None:
    import drivetrain as dt

    with pytest.raises(ValueError) as excinfo:
        dt.Trainer(precision="fp13")
    message = str(excinfo.value)
    assert message.startswith(
        "Unknown precision 'fp13'. Did you mean 'fp32'? Accepted: '64-true', '32-true',"
    )
    # Each name once in the list and once as what its other spellings stand for; each other spelling once.
    assert message.count("'16-mixed'") == 2 and message.count("'bf16-true'") == 1
    assert message.count("'fp16'") == 1 and message.count("/16/") == 1 and "registered" not in message
    registered("int4-custom", _Fp8Precision)
    with pytest.raises(ValueError, match=r"or a registered one: 'int4-custom'\. Register your own"):
        precision_from_name("fp13", "cpu")
