"""Rewrite a wheel: drop files, optionally retag it, and regenerate its RECORD so pip installs it as built."""

import base64
import hashlib
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

from base.errors import HarvestError

WHEEL_NAME = re.compile(r"^(?P<dist>[^-]+)-(?P<version>[^-]+)(-(?P<build>\d[^-]*))?-(?P<tag>[^-]+-[^-]+-[^-]+)\.whl$")


def parse_wheel_name(path: Path) -> dict:
    match = WHEEL_NAME.match(Path(path).name)
    if match is None:
        raise HarvestError(f"{Path(path).name} is not a wheel file name")
    return match.groupdict()


def repack_wheel(src: Path, out_dir: Path, drop: Callable[[str], bool], tag: str | None = None,
                 build: str | None = None, rename: Callable[[str], str] = lambda name: name) -> tuple[Path, list[str]]:
    """Copy `src` into out_dir without the files `drop` selects and with the paths `rename` moves; with `tag`,
    retag it (py3-none-any makes it pure). Returns the new wheel and the dropped paths."""
    parts = parse_wheel_name(src)
    new_tag = tag or parts["tag"]
    build_part = f"-{build}" if build else (f"-{parts['build']}" if parts["build"] else "")
    dst = Path(out_dir) / f"{parts['dist']}-{parts['version']}{build_part}-{new_tag}.whl"
    dropped, record_lines = [], []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        for info in zin.infolist():
            name = info.filename
            if name == record_name:
                continue
            if drop(name):
                dropped.append(name)
                continue
            data = zin.read(name)
            info.filename = name = rename(name)
            if name.endswith(".dist-info/WHEEL") and tag is not None:
                data = _retag(data.decode(), new_tag).encode()
            zout.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record_lines.append(f"{name},sha256={digest},{len(data)}")
        record_lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(record_lines) + "\n")
    return dst, dropped


def _retag(wheel_text: str, tag: str) -> str:
    lines = [line for line in wheel_text.splitlines() if not line.startswith("Tag:")]
    is_pure = tag.endswith("-none-any")
    lines = [f"Root-Is-Purelib: {'true' if is_pure else 'false'}" if line.startswith("Root-Is-Purelib:") else line
             for line in lines]
    return "\n".join(lines + [f"Tag: {tag}"]) + "\n"


def sglang_drop(name: str) -> bool:
    """sglang's one compiled module is the optional gRPC server, built for cp311 only."""
    return name.startswith("sglang/srt/grpc/") and name.endswith(".so")


def sglang_kernel_drop(gpu_arch: str) -> Callable[[str], bool]:
    """Keep one architecture's common_ops and the green-context ops; drop FA3 (flash_ops, 1.07 GB), FlashMLA,
    other architectures, and the mscclpp multi-GPU all-reduce (a cp310 extension plus static libraries)."""
    def drop(name: str) -> bool:
        if re.match(r"sgl_kernel/sm\d+/", name):
            return not name.startswith(f"sgl_kernel/{gpu_arch}/")
        return name.startswith(("sgl_kernel/flash_ops", "sgl_kernel/flashmla_ops", "include/", "lib/", "lib64/",
                                "_mscclpp"))
    return drop


def sglang_kernel_rename(gpu_arch: str) -> Callable[[str], str]:
    """The kept common_ops moves to sgl_kernel/common_ops, the loader's fallback path: the one copy then loads on
    that GPU (its own subfolder is absent) and on a CPU host, where the loader would look in sm100/."""
    prefix = f"sgl_kernel/{gpu_arch}/"
    return lambda name: "sgl_kernel/" + name[len(prefix):] if name.startswith(prefix) else name
