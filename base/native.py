"""Locating what the set-up built from csrc/ (never committed; `make setup` builds it)."""

from pathlib import Path

from base.errors import HarvestError

REPO_ROOT = Path(__file__).resolve().parents[1]
NATIVE_BUILD_DIR = REPO_ROOT / "build" / "native"


def native_library(relative_path: str) -> Path:
    """Path of a library built from csrc/, or a HarvestError saying how to build it."""
    path = NATIVE_BUILD_DIR / relative_path
    if not path.exists():
        raise HarvestError(f"{path} is missing: run the set-up (`make setup`) to build csrc/")
    return path
