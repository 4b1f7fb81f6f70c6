"""`harvest doctor`: ordered checks of the CPU and GPU paths, each with its expected value."""

from harvest.doctor.check import Check, CheckResult
from harvest.doctor.runner import CHECKS, run_checks

__all__ = ["CHECKS", "Check", "CheckResult", "run_checks"]
