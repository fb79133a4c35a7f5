"""The Trainer's setting attributes (``trainer.limit_train_batches`` …) for several configurations, on Lightning
or on drivetrain: ``python trainer_attributes.py lightning`` prints them as JSON (the test compares)."""

from __future__ import annotations

import json
import sys
from typing import Any

CONFIGS: list[dict[str, Any]] = [
    {},
    {
        "limit_train_batches": 3,
        "limit_val_batches": 0.5,
        "limit_test_batches": 2,
        "limit_predict_batches": 0.25,
        "val_check_interval": 0.25,
        "num_sanity_val_steps": -1,
        "gradient_clip_val": 0.5,
    },
    {
        "gradient_clip_val": 1.0,
        "gradient_clip_algorithm": "value",
        "check_val_every_n_epoch": None,
        "val_check_interval": 7,
    },
    {"fast_dev_run": True},
    {"fast_dev_run": 3},
    {"overfit_batches": 2},
    {"overfit_batches": 0.5},
    {"min_epochs": 2, "min_steps": 4, "max_epochs": 5},
]
NAMES = (
    "limit_train_batches",
    "limit_val_batches",
    "limit_test_batches",
    "limit_predict_batches",
    "val_check_interval",
    "check_val_every_n_epoch",
    "num_sanity_val_steps",
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "min_epochs",
    "min_steps",
    "max_steps",
    "evaluating",
)


def attributes(framework: str) -> list[dict[str, Any]]:
    if framework == "lightning":
        from lightning.pytorch import Trainer
    else:
        from drivetrain import Trainer
    rows = []
    for config in CONFIGS:
        trainer = Trainer(
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            **config,
        )
        rows.append({name: _plain(getattr(trainer, name)) for name in NAMES})
    return rows


def _plain(value: Any) -> Any:
    """A JSON value with its type kept (1 and 1.0 differ: a count or a fraction); a str enum is its str."""
    if isinstance(value, str):
        return ["str", str(getattr(value, "value", value))]
    return [
        type(value).__name__,
        value if value is None or isinstance(value, (int, float, str)) else str(value),
    ]


if __name__ == "__main__":
    print(json.dumps(attributes(sys.argv[1])))
