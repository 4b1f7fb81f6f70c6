"""A CPU stand-in for the GPU image: a fresh venv of the target Python holding torch 2.11.0 and the packages
the bundle expects from the image (manifest `image_provides`), fetched from the registry once into a cache.

The bundle's CPU twin installs into it offline, as the GPU host would.
"""

import glob
import os
import subprocess
import sys
from pathlib import Path

from base.errors import HarvestError

TORCH = "torch==2.11.0"
TWIN_CACHE = Path.home() / ".cache" / "harvest" / "twin-wheels"


def find_python(version: str) -> str:
    """An interpreter of `version` that runs (a pyenv shim on PATH may name one it will not start)."""
    candidates = [f"python{version}", *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))]
    for candidate in candidates:
        try:
            out = subprocess.run([candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    raise HarvestError(f"no working python{version} on this host (tried {', '.join(candidates)})")


def make_image_twin(venv_dir: Path, python_version: str, image_provides: dict[str, str]) -> Path:
    """Create venv_dir with torch and image_provides installed offline from TWIN_CACHE (downloaded first if
    missing); returns the venv's python."""
    subprocess.run([find_python(python_version), "-m", "venv", str(venv_dir)], check=True)
    python = venv_dir / "bin" / "python"
    pinned = [f"{name}=={version}" for name, version in sorted(image_provides.items())]
    _pip(python, "download", "-q", "-d", str(TWIN_CACHE), TORCH)
    _pip(python, "install", "-q", "--no-index", "--find-links", str(TWIN_CACHE), TORCH)
    if pinned:
        _pip(python, "download", "-q", "--no-deps", "-d", str(TWIN_CACHE), *pinned)
        _pip(python, "install", "-q", "--no-index", "--no-deps", "--find-links", str(TWIN_CACHE), *pinned)
    return python


def _pip(python: Path, *args: str) -> None:
    # pip skips files already in the download folder, so a rerun only asks the index.
    out = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if out.returncode != 0:
        raise HarvestError(f"pip {args[0]} into the image twin failed: {out.stderr.strip()[-1500:]}")


if __name__ == "__main__":
    print(find_python(sys.argv[1] if len(sys.argv) > 1 else "3.12"))
