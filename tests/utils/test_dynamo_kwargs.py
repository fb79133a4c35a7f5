"""``TorchDynamoPlugin.to_kwargs()`` as Accelerate's: only the settings asked for, never ``None``s."""

from __future__ import annotations

import pytest

from drivetrain.utils import TorchDynamoPlugin


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, {}),
        ({"backend": "no"}, {}),
        ({"backend": "inductor"}, {"backend": "inductor"}),
        ({"backend": "INDUCTOR", "mode": "default", "fullgraph": False}, {"backend": "inductor"}),
        (
            {"backend": "inductor", "mode": "max-autotune", "fullgraph": True},
            {"backend": "inductor", "mode": "max-autotune", "fullgraph": True},
        ),
        ({"backend": "eager", "dynamic": False}, {"backend": "eager", "dynamic": False}),
        (
            {"backend": "inductor", "options": {"trace.enabled": True}},
            {"backend": "inductor", "options": {"trace.enabled": True}},
        ),
    ],
)
def test_to_kwargs_holds_only_what_was_asked_for(
    settings: dict[str, object], expected: dict[str, object]
) -> None:
    kwargs = TorchDynamoPlugin(**settings).to_kwargs()  # type: ignore[arg-type]
    assert kwargs == expected
    assert None not in kwargs.values()
