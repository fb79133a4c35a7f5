"""From what the kit's programs wrote to rows of the report: each whole-program check, passed or why not.

The uninterrupted fits of the ``first`` program are the reference: evaluation results must be what
the reference weights give when computed by hand in one process, and the resumed runs must end
with the same weights, optimizer state, step count and random generators, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from drivetrain.testing.kit_model import EPOCHS, PREDICT, TEST, VAL, expected, steps_per_epoch
from drivetrain.testing.report import CheckResult, failed, not_applicable, passed
from drivetrain.testing.runner import ProgramRun

#: What to change when a resumed run differs from the uninterrupted one, by the kind of plugin checked.
RESUME_FIX = {
    "accelerator": "make get_rng_state()/set_rng_state() save and restore every generator of the device, and "
    "keep parse_devices/get_parallel_devices deterministic",
    "strategy": "save and load every piece of state the strategy owns (module, optimizer, precision) in "
    "save_checkpoint/load_checkpoint (or get_module_state_dict/get_optimizer_state and their loads)",
    "precision": "return the loss scaler's (and any other) state from state_dict() and restore it in load_state_dict()",
    "checkpoint_io": "make load_checkpoint() return exactly what save_checkpoint() was given: every key, unchanged",
    "cluster_environment": "report the same ranks in every attempt of the job (global_rank, local_rank, world_size)",
}


def _load(root: Path, name: str, rank: int) -> dict[str, Any] | None:
    path = root / "results" / f"{name}-rank{rank}.pt"
    if not path.exists():
        return None
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # unreadable counts as missing: the row says the program wrote no results
        return None


class Outcomes:
    """The results of one run (1 or N processes) and the program runs that produced them."""

    def __init__(
        self, root: Path, world: int, runs: Mapping[str, ProgramRun], kind: str, tolerance: float
    ) -> None:
        self.root, self.world, self.runs, self.kind, self.tolerance = root, world, runs, kind, tolerance
        self.label = f"{world} process{'es' if world > 1 else ''}"

    def results(self, name: str) -> list[dict[str, Any]] | None:
        found = [_load(self.root, name, rank) for rank in range(self.world)]
        return None if any(r is None for r in found) else [r for r in found if r is not None]

    def _program_failed(self, check: str, phase: str, what: str) -> CheckResult:
        run = self.runs.get(phase)
        if run is None:
            return failed(check, f"the {phase} program did not run", "see the rows above")
        how = (
            "did not finish within its time limit (a hang?)"
            if run.timed_out
            else f"ended with {run.returncode}"
        )
        fix = (
            f"run it yourself to see the whole output: {run.command} (in {self.root}, with DRIVETRAIN_KIT_SETTINGS="
            f"{self.root / 'settings.json'})"
        )
        if run.timed_out and self.kind == "strategy" and self.world > 1:
            fix += (
                ". A hang in evaluation (the processes get different numbers of batches) means every forward pass "
                "talks to the other processes: declare forward_is_collective = True"
            )
        return failed(check, f"{what}: the {phase} program {how}. Its last error: {run.last_error()}", fix)

    def _close(self, got: Any, want: Any) -> bool:
        got, want = torch.as_tensor(got, dtype=torch.float32), torch.as_tensor(want, dtype=torch.float32)
        return got.shape == want.shape and torch.allclose(got, want, atol=self.tolerance, rtol=self.tolerance)

    # -- the Trainer door ------------------------------------------------------------------------
    def trainer_stages(self) -> list[CheckResult]:
        stages = f"Trainer, {self.label}: fit with validation, validate, test, predict"
        restored = f"Trainer, {self.label}: validate from a saved checkpoint"
        results = self.results("trainer-first")
        if results is None:
            return [self._program_failed(name, "first", "it wrote no results") for name in (stages, restored)]
        want = expected(results[0]["weights"])
        steps = EPOCHS * steps_per_epoch(self.world)
        problems: list[str] = []
        for rank, result in enumerate(results):
            where = f" on rank {rank}" if self.world > 1 else ""
            if result["steps"] != steps:
                problems.append(f"fit made {result['steps']} optimizer steps{where}, expected {steps}")
            for stage, key, count, size in (
                ("validate", "validated", "val", len(VAL)),
                ("test", "tested", "test", len(TEST)),
            ):
                got = result[key]
                if not self._close(got.get(f"{count}_loss", float("nan")), want[f"{count}_loss"]):
                    problems.append(
                        f"{stage} reported {count}_loss={got.get(f'{count}_loss')}{where}, the weights give {want[f'{count}_loss']:.6g}"
                    )
                if got.get(f"{count}_count") != size:
                    problems.append(
                        f"{stage} saw {got.get(f'{count}_count')} samples{where}, the data set has {size}"
                    )
            if not self._close(result["metrics"].get("val_loss", float("nan")), want["val_loss"]):
                problems.append(
                    f"the validation inside fit reported val_loss={result['metrics'].get('val_loss')}{where}"
                )
            if not self._close(result["predictions"], want["predictions"]):
                problems.append(
                    f"predict returned {tuple(result['predictions'].shape)} predictions{where} that differ from the weights' ({len(PREDICT)} samples in order)"
                )
        rows = [
            self._row(
                stages,
                problems,
                "evaluation and prediction must see every sample once, on the trained weights (check the strategy's data sharding, reductions and forward_is_collective)",
            )
        ]
        refusal = results[0]["from_checkpoint"].get("not_implemented")
        if refusal:
            rows.append(
                not_applicable(restored, f"the strategy does not support it (NotImplementedError): {refusal}")
            )
            return rows
        bad = [
            r
            for r, result in enumerate(results)
            if not self._close(result["from_checkpoint"].get("val_loss", float("nan")), want["val_loss"])
        ]
        rows.append(
            self._row(
                restored,
                [
                    f"validate(ckpt_path=...) of the saved checkpoint gave val_loss={results[r]['from_checkpoint'].get('val_loss')} on rank {r}, the saved weights give {want['val_loss']:.6g}"
                    for r in bad
                ],
                "load_checkpoint must bring back the weights save_checkpoint wrote",
            )
        )
        return rows

    def trainer_resume(self) -> CheckResult:
        check = f"Trainer, {self.label}: save, kill, resume bit-exactly"
        return self._resume(check, "trainer-first", "trainer-resumed", "trainer", "second")

    # -- the Accelerator door ----------------------------------------------------------------------
    def accelerator_training(self) -> CheckResult:
        check = f"Accelerator, {self.label}: prepare, train, evaluate with gather_for_metrics"
        results = self.results("accelerator-first")
        if results is None:
            return self._program_failed(check, "first", "it wrote no results")
        want = expected(results[0]["weights"])
        steps = EPOCHS * steps_per_epoch(self.world)
        problems: list[str] = []
        for rank, result in enumerate(results):
            where = f" on rank {rank}" if self.world > 1 else ""
            if result["steps"] != steps:
                problems.append(
                    f"the loop made {result['steps']} steps{where}, expected {steps} (the prepared loader's shard)"
                )
            for name, wanted in (("val", want["val_predictions"]), ("predict", want["predictions"])):
                if not self._close(result["evaluated"][name], wanted):
                    problems.append(
                        f"gather_for_metrics gave {tuple(result['evaluated'][name].shape)} {name} outputs{where} that differ from the weights' (every sample once, in order)"
                    )
        return self._row(
            check,
            problems,
            "gather must return every process's tensors in rank order, and the prepared loaders must share each sample once",
        )

    def accelerator_resume(self) -> CheckResult:
        check = f"Accelerator, {self.label}: save_state, kill, load_state bit-exactly"
        return self._resume(check, "accelerator-first", "accelerator-resumed", "accelerator", "third")

    # -- shared ------------------------------------------------------------------------------------
    def _resume(
        self, check: str, reference_name: str, resumed_name: str, door: str, phase: str
    ) -> CheckResult:
        reference = self.results(reference_name)
        if reference is None:
            return self._program_failed(check, "first", "the uninterrupted run wrote no results")
        if not (self.root / "results" / f"killed-{door}").exists():
            killed_phase = "first" if door == "trainer" else "second"
            return self._program_failed(
                check, killed_phase, "the run to be killed did not get to its checkpoint"
            )
        resumed = self.results(resumed_name)
        if resumed is None:
            return self._program_failed(check, phase, "the resumed run wrote no results")
        problems: list[str] = []
        for rank, (want, got) in enumerate(zip(reference, resumed, strict=True)):
            where = f" on rank {rank}" if self.world > 1 else ""
            problems += [f"{p}{where}" for p in _differences(want, got)]
        return self._row(
            check,
            problems,
            RESUME_FIX[self.kind],
            prefix="the resumed run differs from the uninterrupted one: ",
        )

    def collectives(self) -> CheckResult:
        check = f"{self.label}: the strategy's collectives (all_reduce, all_gather, broadcast, barrier …)"
        results = self.results("collectives")
        if results is None:
            return self._program_failed(check, "first", "it wrote no results")
        problems = [
            f"{name}: {message} (rank {rank})"
            for rank, result in enumerate(results)
            for name, message in result.items()
            if message
        ]
        return self._row(
            check,
            problems,
            "implement each collective named here on the strategy (torch.distributed's all_reduce, all_gather, broadcast_object_list, barrier), as ParallelStrategy does",
        )

    def declarations(self) -> CheckResult:
        check = f"{self.label}: what the strategy declares matches what it does"
        results = self.results("accelerator-first")
        if results is None:
            return self._program_failed(check, "first", "it wrote no results")
        problems = []
        for rank, result in enumerate(results):
            found = result["declarations"]
            if found["wraps_models"] != found["wrapped"]:
                what = "a wrapper around the model" if found["wrapped"] else "the model itself"
                problems.append(
                    f"wraps_models={found['wraps_models']}, but prepare() returned {what} (rank {rank})"
                )
            if found["after_inference_mode"]:
                problems.append(
                    f"supports_inference_mode=True, but training after an evaluation under torch.inference_mode "
                    f"failed: {found['after_inference_mode']} (rank {rank})"
                )
        return self._row(
            check,
            sorted(set(problems)),
            "declare wraps_models and supports_inference_mode as the strategy behaves (docs/extending.md, "
            "'What a strategy declares')",
        )

    def names_everywhere(self, accelerator: str | None, strategy: str | None, via: str) -> CheckResult:
        check = f"{self.label}: {via} in every process"
        problems = []
        for name in ("trainer-first", "accelerator-first", "trainer-resumed", "accelerator-resumed"):
            for rank, result in enumerate(self.results(name) or []):
                for kind, want in (("accelerator", accelerator), ("strategy", strategy)):
                    if want is not None and result.get(kind) != want:
                        problems.append(
                            f"{name.split('-')[0]} built {result.get(kind)} on rank {rank}, not {want}"
                        )
        return self._row(
            check,
            problems,
            "register the name when the class is defined (register_accelerators / register_strategies) in a module the script imports",
        )

    def accelerator_hooks(self, reports_device_state: bool) -> CheckResult:
        check = f"{self.label}: the hooks drivetrain calls on the accelerator"
        first, resumed = self.results("trainer-first"), self.results("trainer-resumed")
        if first is None or resumed is None:
            return self._program_failed(check, "first" if first is None else "second", "it wrote no results")
        problems = []
        if "setup_device" not in first[0]["calls"]:
            problems.append("setup_device() was never called")
        if "get_rng_state" not in first[0]["calls"]:
            problems.append("get_rng_state() was not called when a checkpoint was saved")
        if reports_device_state and "set_rng_state" not in resumed[0]["calls"]:
            problems.append("set_rng_state() was not called when the checkpoint was loaded")
        return self._row(
            check,
            problems,
            "keep the hooks' names and signatures as drivetrain.accelerators.Accelerator defines them",
        )

    def _row(self, check: str, problems: list[str], fix: str, prefix: str = "") -> CheckResult:
        if not problems:
            return passed(check)
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        return failed(check, prefix + shown + ".", fix[0].upper() + fix[1:] + ".")


def _differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    if want["steps"] != got["steps"]:
        return [f"it ended at step {got['steps']}, the uninterrupted run at {want['steps']}"]
    found = []
    wanted_generator, got_generator = want.get("device_generator"), got.get("device_generator")
    if (
        wanted_generator is not None
        and got_generator is not None
        and not torch.equal(wanted_generator, got_generator)
    ):
        found.append(
            "the device's own random generator is not where the uninterrupted run left it (it was not saved and restored)"
        )
    if not torch.equal(want["cpu_draw"], got["cpu_draw"]):
        found.append("torch's CPU generator is not where the uninterrupted run left it")

    def changed(key: str) -> list[str]:
        return [
            name
            for name in want[key]
            if name not in got[key] or not torch.equal(want[key][name], got[key][name])
        ]

    if changed("weights"):
        found.append(f"the weights differ ({', '.join(changed('weights')[:3])})")
    if changed("optimizer"):
        found.append(f"the optimizer state differs ({', '.join(changed('optimizer')[:3])})")
    return found
