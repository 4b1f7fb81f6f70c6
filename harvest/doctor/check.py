"""Check: one doctor check, its expected value and what a different value means; CheckResult: its outcome;
check_table: a module's checks, each declared on its function."""

from collections.abc import Callable
from dataclasses import dataclass, field

PASS, FAIL, INFO, SKIP = "PASS", "FAIL", "INFO", "SKIP"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    run: Callable[[], dict]
    """Returns {"status": PASS/FAIL/INFO, **measured values}; an exception is a FAIL naming it."""
    expected: str
    if_different: str
    needs_gpu: bool = False
    isolated: bool = False
    """Run in a subprocess of its own: the check may leave the CUDA context dead (a fault is its finding)."""
    gate: bool = False
    """Later checks of the same tier depend on it: a FAIL here skips them."""
    record_only: bool = False
    """It records what the device does and harvest's code is not under test: an isolated process that dies is
    its finding (INFO), not a FAIL."""


@dataclass(slots=True)
class CheckResult:
    check: str
    status: str
    expected: str
    if_different: str
    values: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"check": self.check, "status": self.status, **self.values, "expected": self.expected,
                "if_different": self.if_different}


def check_table(**flags) -> tuple[list[Check], Callable]:
    """A module's checks in the order its functions are defined, and the decorator that declares one, named
    after its function: `CHECKS, check = check_table(needs_gpu=True)`, then `@check(expected=..., if_different=...)`
    above each check function. `flags` hold for every check of the table; a check's own override them."""
    checks: list[Check] = []

    def check(expected: str, if_different: str, **own) -> Callable:
        def add(run: Callable[[], dict]) -> Callable[[], dict]:
            checks.append(Check(run.__name__, run, expected, if_different, **(flags | own)))
            return run

        return add

    return checks, check
