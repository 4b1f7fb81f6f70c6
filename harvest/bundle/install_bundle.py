#!/usr/bin/env python3
"""Install a harvest offline bundle, with nothing but this interpreter's standard library and pip.

  python3 install_bundle.py --target DIR            # into DIR; then PYTHONPATH=DIR, PATH=DIR/bin:$PATH
  python3 install_bundle.py --python VENV/bin/python  # into that interpreter's environment

Checks every part's sha256 against manifest.json, reassembles the payload, checks it and every wheel, installs
the wheels with `pip install --no-index --no-deps` (the target image provides the rest, listed under
`image_provides`), places the native libraries where harvest finds them, and prints what it installed.
Parts may sit in several folders (they arrive in separate transfers): name each with --parts-from.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

MANIFEST_NAME = "manifest.json"


class BundleError(Exception):
    pass


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(2**20):
            digest.update(block)
    return digest.hexdigest()


def find_parts(manifest: dict, folders: list[Path]) -> list[Path]:
    found = []
    for part in manifest["parts"]:
        candidates = [folder / part["name"] for folder in folders if (folder / part["name"]).is_file()]
        if not candidates:
            raise BundleError(f"part {part['name']} is missing (looked in {', '.join(map(str, folders))})")
        path = candidates[0]
        if path.stat().st_size != part["bytes"] or sha256_of(path) != part["sha256"]:
            raise BundleError(f"part {path} is damaged: size or sha256 differs from the manifest")
        found.append(path)
    return found


def reassemble(parts: list[Path], manifest: dict, work_dir: Path) -> Path:
    payload = work_dir / manifest["payload"]["name"]
    with payload.open("wb") as out:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, out)
    if sha256_of(payload) != manifest["payload"]["sha256"]:
        raise BundleError("the reassembled payload's sha256 differs from the manifest")
    with tarfile.open(payload) as tar:
        tar.extractall(work_dir / "payload", filter="data")
    payload.unlink()
    return work_dir / "payload"


def check_wheels(manifest: dict, wheels_dir: Path) -> list[Path]:
    wheels = []
    for wheel in manifest["wheels"]:
        path = wheels_dir / wheel["file"]
        if not path.is_file() or sha256_of(path) != wheel["sha256"]:
            raise BundleError(f"wheel {wheel['file']} is missing or its sha256 differs from the manifest")
        wheels.append(path)
    return wheels


def pip_install(python: str, wheels: list[Path], wheels_dir: Path, target: Path | None) -> None:
    command = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--find-links", str(wheels_dir)]
    if target is not None:
        command += ["--target", str(target), "--upgrade"]
    out = subprocess.run(command + [str(w) for w in wheels], capture_output=True, text=True)
    if out.returncode != 0:
        raise BundleError(f"pip install failed: {out.stderr.strip()[-2000:]}")


def site_dir(python: str, target: Path | None) -> Path:
    if target is not None:
        return target
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip())


def install_native(payload_dir: Path, site: Path, python: str, target: Path | None) -> str:
    """harvest looks for its native libraries in build/native beside its packages. Rebuild from csrc where a C
    compiler exists (this also builds the CUDA backend where nvcc is); else use the libraries built with the bundle."""
    dest = site / "build" / "native"
    csrc = payload_dir / "native" / "csrc"
    if shutil.which("make") and shutil.which("cc"):
        # The stub's symbol list is read from the installed sgl_kernel, which a --target install hides from python.
        env = {**os.environ, "PYTHONPATH": f"{target}:{os.environ.get('PYTHONPATH', '')}"} if target else None
        out = subprocess.run(["make", "-s", "-C", str(csrc), f"OUT={dest}", f"PYTHON={python}"],
                             capture_output=True, text=True, env=env)
        if out.returncode == 0:
            shutil.copytree(csrc, site / "build" / "csrc", dirs_exist_ok=True)
            return f"built from csrc into {dest}"
        print(f"warning: building csrc failed, using the prebuilt libraries: {out.stderr.strip()[-300:]}",
              file=sys.stderr)
    prebuilt = payload_dir / "native" / "build"
    if not prebuilt.is_dir():
        raise BundleError("no C compiler here and the bundle holds no prebuilt native libraries")
    shutil.copytree(prebuilt, dest, dirs_exist_ok=True)
    return f"prebuilt libraries copied into {dest}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", type=Path, help="install into this directory (pip --target)")
    where.add_argument("--python", help="install into this interpreter's environment (e.g. a venv's python)")
    parser.add_argument("--parts-from", type=Path, action="append", default=[],
                        help="another folder holding parts (repeatable); the bundle's own folder is always searched")
    args = parser.parse_args(argv)
    bundle_dir = Path(__file__).resolve().parent
    python = args.python or sys.executable
    started = time.perf_counter()
    try:
        manifest = json.loads((bundle_dir / MANIFEST_NAME).read_text())
        parts = find_parts(manifest, [bundle_dir, *args.parts_from])
        want = manifest["target"]["python"]
        have = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        if have != want:
            raise BundleError(f"this bundle is for Python {want}; {python} is Python {have}")
        with tempfile.TemporaryDirectory(prefix="harvest-install-") as tmp:
            payload_dir = reassemble(parts, manifest, Path(tmp))
            wheels_dir = payload_dir / "wheels"
            wheels = check_wheels(manifest, wheels_dir)
            if args.target is not None:
                args.target.mkdir(parents=True, exist_ok=True)
            pip_install(python, wheels, wheels_dir, args.target)
            native = install_native(payload_dir, site_dir(python, args.target), python, args.target)
    except (BundleError, OSError, subprocess.CalledProcessError, KeyError, ValueError) as e:
        print(f"install_bundle: error: {e}", file=sys.stderr)
        return 1
    print(f"installed {len(wheels)} wheels from {len(parts)} parts in {time.perf_counter() - started:.1f} s:")
    for wheel in manifest["wheels"]:
        print(f"  {wheel['file']}  ({wheel['why']})")
    print(f"native: {native}")
    missing = sorted(manifest.get("image_provides", {}))
    print(f"expected from the image (not carried): {', '.join(missing)}")
    if args.target is not None:
        print(f"use it: export PYTHONPATH={args.target}:$PYTHONPATH PATH={args.target}/bin:$PATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
