"""The conformance kit as a pytest plugin: ``pytest -p drivetrain.testing.pytest_plugin --drivetrain-plugin TARGET``.

Each ``--drivetrain-plugin`` (repeatable; the same targets as ``drivetrain check-plugin``) becomes
one test that runs the kit and fails with every failed check, its reason and what to implement
(the whole table is printed either way). ``--drivetrain-fake``, ``--drivetrain-contract-only`` and
``--drivetrain-devices N`` are the command's ``--fake``, ``--contract-only`` and ``--devices``.

Inside your own tests, the ``drivetrain_check`` fixture runs a check and fails the test on any
failed row::

    def test_my_accelerator(drivetrain_check):
        report = drivetrain_check(check_accelerator, MyAccelerator, fake=True)
        assert report.row("accelerator: registered under a short name").passed

Only pytest imports this module (``-p`` or a ``pytest11`` entry point); ``drivetrain.testing`` never does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from drivetrain.testing.command import check_plugin
from drivetrain.testing.report import PluginCheckError, Report


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("drivetrain", "drivetrain plugin conformance kit")
    group.addoption(
        "--drivetrain-plugin",
        action="append",
        default=[],
        metavar="TARGET",
        help="a plugin to check (module:Class …)",
    )
    group.addoption(
        "--drivetrain-fake", action="store_true", help="run accelerators on CPU tensors behind their own name"
    )
    group.addoption(
        "--drivetrain-contract-only", action="store_true", help="the contract checks only (no whole programs)"
    )
    group.addoption(
        "--drivetrain-devices", type=int, default=2, help="devices (processes) of the multi-process programs"
    )
    group.addoption(
        "--drivetrain-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a cluster environment's variable, placeholders {rank} {local_rank} {node_rank} {world_size} {port} (repeat)",
    )


class PluginCheckItem(pytest.Item):
    """One ``--drivetrain-plugin`` target: the kit's checks of everything it names."""

    def __init__(self, *, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target

    def runtest(self) -> None:

        options = self.config.option
        env = {}
        for item in options.drivetrain_env:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise PluginCheckError(f"--drivetrain-env takes NAME=VALUE, got {item!r}.")
            env[name] = value
        try:
            reports = check_plugin(
                self.target,
                fake=options.drivetrain_fake,
                devices=options.drivetrain_devices,
                whole_programs=not options.drivetrain_contract_only,
                env=env or None,
            )
        except ValueError as error:  # the target itself: one clear line, not the kit's traceback
            raise PluginCheckError(str(error).replace("--env ", "--drivetrain-env ")) from None
        for report in reports:
            print(report)
        failures = [str(error) for error in _failures(reports)]
        if failures:
            raise PluginCheckError("\n\n".join(failures))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, PluginCheckError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int, str]:
        return "drivetrain-plugin", 0, f"drivetrain plugin check: {self.target}"


def _failures(reports: list[Report]) -> list[PluginCheckError]:
    found = []
    for report in reports:
        try:
            report.raise_for_failures()
        except PluginCheckError as error:
            found.append(error)
    return found


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    for target in config.getoption("drivetrain_plugin"):
        items.append(PluginCheckItem.from_parent(session, name=f"drivetrain-plugin[{target}]", target=target))


@pytest.fixture
def drivetrain_check() -> Callable[..., Report]:
    """Run ``check(*args, **kwargs)`` (one of ``drivetrain.testing``'s checks), print its table, fail on any failed row."""

    def run(check: Callable[..., Report], *args: Any, **kwargs: Any) -> Report:
        report = check(*args, **kwargs)
        print(report)
        report.raise_for_failures()
        return report

    return run
