"""A dry run of real case scripts: drivetrain's Trainer against the raw loop, tiny and short."""

from __future__ import annotations

import sys

from benchmarks.cases.step_time import SCRIPTS
from benchmarks.harness import Runner, Variant

CONFIG = {"model": "tiny", "warmup_steps": 2, "timed_steps": 6, "batch_size": 16, "lr": 0.05, "seed": 0}


def test_drivetrain_trainer_script_trains_like_the_raw_loop() -> None:
    runner = Runner(threads=1, timeout_s=60)
    try:
        raw = runner.run_once(Variant("raw", "raw", (sys.executable, str(SCRIPTS / "raw.py"))), CONFIG)
        trainer = runner.run_once(
            Variant(
                "drivetrain_trainer_log",
                "drivetrain Trainer + self.log",
                (sys.executable, str(SCRIPTS / "drivetrain_trainer.py")),
                config={"log_metric": True},
            ),
            CONFIG,
        )
    finally:
        runner.close()
    assert raw.error is None, raw.error
    assert trainer.error is None, trainer.error
    assert raw.result["steps"] == trainer.result["steps"] == 8
    assert trainer.result["final_loss"] == raw.result["final_loss"]
    assert 0 < trainer.result["step_s"] < 1
    assert trainer.result["first_step_s"] > 0
    assert trainer.result["max_rss_mib"] > 10
