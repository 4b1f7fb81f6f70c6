"""scripts/gpu_first_light.sh on the CPU: its dry run checks every harvest command line against the real
parsers, the carry fits one device call, and it keeps its files inside $OUT and the checkout."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from harvest.bundle.bundle_builder import PART_BYTES, PAYLOAD_NAME

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_first_light.sh"
CARRY_LIMIT_BYTES = 63 * 2**20
"""One device call carries 64 MiB (tracked tree included); 1 MiB stays free for what a session adds before it
commits (a lease's results come back as a few hundred KiB). The script's own limit, the same number."""
NUM_HARVEST_COMMANDS = 9


def dry_run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}
    env.pop("OUT", None)
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.run([str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, timeout=300, env=env,
                          check=False, cwd=REPO)


def fake_bundle(folder: Path, part_bytes: int, num_missing_parts: int = 0) -> Path:
    """A bundle folder with one part of part_bytes (sparse: its size counts, no disk) and, in its manifest,
    num_missing_parts more that are not there."""
    folder.mkdir()
    (folder / "install_bundle.py").write_text("")
    with open(folder / f"{PAYLOAD_NAME}.part000", "wb") as part:
        part.truncate(part_bytes)
    parts = [{"name": f"{PAYLOAD_NAME}.part{i:03d}", "bytes": part_bytes} for i in range(1 + num_missing_parts)]
    (folder / "manifest.json").write_text(json.dumps({"parts": parts}))
    return folder


def test_dry_run_checks_every_command_against_the_real_parsers(tmp_path):
    proc = dry_run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = [line for line in proc.stdout.splitlines() if line.startswith(("ok ", "REFUSED"))]
    assert len(checked) == NUM_HARVEST_COMMANDS and all(line.startswith("ok ") for line in checked), proc.stdout
    assert any("--colocation temporal" in line for line in checked)  # the temporal stage: not the default on a GPU
    written = [p for name in ("home", "tmp") for p in (tmp_path / name).rglob("*")]
    assert written == [], f"the dry run wrote outside the checkout: {written[:5]}"


def test_the_argv_check_refuses_what_a_parser_refuses():
    lines = ["harvest serve --model-path M --no-such-sglang-flag 1", "harvest model make --shape nope --random --out D",
             "harvest replay --trace conv --out D --bogus", "harvest serve --model-path M --attention-backend triton"]
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "check_argv.py")], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    verdicts = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith(("ok ", "REFUSED"))]
    assert verdicts == ["REFUSED", "REFUSED", "REFUSED", "ok"] and proc.returncode == 1, proc.stdout


def tracked_tree_bytes() -> int:
    names = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True, cwd=REPO).stdout.split(b"\0")
    return sum((REPO / name.decode()).stat().st_size for name in names if name and (REPO / name.decode()).is_file())


def test_one_bundle_part_and_the_tracked_tree_fit_one_call():
    """The bundle builder's part cap beside the checkout's tracked files: what one device call must carry."""
    assert tracked_tree_bytes() + PART_BYTES <= CARRY_LIMIT_BYTES


def test_dry_run_refuses_a_carry_over_one_call_and_a_missing_part(tmp_path):
    assert dry_run(tmp_path, "--bundle", str(fake_bundle(tmp_path / "fits", PART_BYTES))).returncode == 0
    proc = dry_run(tmp_path, "--bundle", str(fake_bundle(tmp_path / "big", CARRY_LIMIT_BYTES, num_missing_parts=1)))
    assert proc.returncode == 1 and "TOO BIG" in proc.stdout and "MISSING" in proc.stdout, proc.stdout


def test_the_run_brings_back_at_most_eight_files():
    """A lent GPU returns at most 8 files from $OUT: a ninth is left out, silently, with its stage's results."""
    names = set(re.findall(r'"\$out/([A-Za-z0-9_.$-]+)"', SCRIPT.read_text()))
    if "$1.tgz" in names:  # pack_run: one archive per worker stage and the profile's
        names = names - {"$1.tgz"} | {"temporal.tgz", "spatial.tgz", "profile.tgz"}
    assert {"facts.json", "stages.log", "temporal.tgz", "spatial.tgz", "profile.tgz"} <= names and len(names) <= 8, names


def test_the_run_keeps_home_tmp_and_caches_in_the_checkout():
    """A lent GPU brings back only $OUT; the rest must not land in the image's folders either."""
    text = SCRIPT.read_text()
    assert "export HOME=$work/home TMPDIR=$work/tmp" in text and "export work=$repo/.first-light" in text
    assert "/tmp" not in text.replace("$work/tmp", "") and "/var/" not in text
    assert "/.first-light/" in (REPO / ".gitignore").read_text().splitlines()


def test_a_run_writes_its_results_into_out_as_each_stage_finishes(tmp_path):
    """The facts stage for real, on this host: facts.json and the stage log land in $OUT and nothing else does
    (a lent GPU brings back only $OUT, at most 8 files)."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "HARVEST_COMMIT": "test"}
    proc = subprocess.run([str(SCRIPT), "--only", "facts"], capture_output=True, text=True, timeout=300, env=env,
                          check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["facts.json", "stages.log"]
    facts = json.loads((out / "facts.json").read_text())
    assert facts["commit"] == "test" and {"gpu", "nvcc", "torch", "cuda-bindings"} <= facts.keys()
    assert "== facts rc=0" in (out / "stages.log").read_text()
