"""A conformance kit for plugin authors: does your accelerator, strategy, precision, checkpoint IO or cluster environment hold?

Each ``check_*`` function tries the contract drivetrain's core relies on (the seeds' methods and
every hook the core calls) and then, by default, whole programs with the plugin in them through
both front doors (``Trainer`` and ``Accelerator``): fit with validation, validate, test, predict,
save → kill → resume bit-exactly (random generators included), on 1 and 2 processes where the
plugin allows, by its registered name, through ``python train.py fit --trainer.accelerator=NAME``
and ``drivetrain launch -n 2``. It returns a :class:`Report`; ``print(report)`` shows a table in
which every check passed, failed (with the reason and what to implement) or does not apply (and
why)::

    from drivetrain.testing import check_accelerator

    report = check_accelerator(XPUAccelerator, devices=2, fake=True)
    print(report)
    report.raise_for_failures()

``fake=True`` runs an accelerator whose hardware is absent on CPU tensors behind its own name, so
a vendor's CI needs no device. The same checks run from the command line
(``drivetrain check-plugin my_package:XPUAccelerator --fake``) and from pytest
(``pytest -p drivetrain.testing.pytest_plugin --drivetrain-plugin my_package:XPUAccelerator``).
Importing this package imports neither pytest nor the checks' machinery: names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain.testing.checks import (
        check_accelerator,
        check_checkpoint_io,
        check_cluster_environment,
        check_precision,
        check_strategy,
    )
    from drivetrain.testing.command import check_plugin
    from drivetrain.testing.fake import fake_accelerator
    from drivetrain.testing.fake_hardware import FakeHardware
    from drivetrain.testing.report import CheckResult, PluginCheckError, Report, Status
    from drivetrain.testing.stand_ins import StandIn

_CHECKS = "drivetrain.testing.checks"
_REPORT = "drivetrain.testing.report"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "check_accelerator": _CHECKS,
        "check_strategy": _CHECKS,
        "check_precision": _CHECKS,
        "check_checkpoint_io": _CHECKS,
        "check_cluster_environment": _CHECKS,
        "check_plugin": "drivetrain.testing.command",
        "Report": _REPORT,
        "CheckResult": _REPORT,
        "Status": _REPORT,
        "PluginCheckError": _REPORT,
        "FakeHardware": "drivetrain.testing.fake_hardware",
        "StandIn": "drivetrain.testing.stand_ins",
        "fake_accelerator": "drivetrain.testing.fake",
    },
)

__all__ = [
    "CheckResult",
    "FakeHardware",
    "PluginCheckError",
    "Report",
    "StandIn",
    "Status",
    "check_accelerator",
    "check_checkpoint_io",
    "check_cluster_environment",
    "check_plugin",
    "check_precision",
    "check_strategy",
    "fake_accelerator",
]
