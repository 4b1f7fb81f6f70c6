"""The offline bundle's CPU twin: build it for cp312, check its parts, install it with no index into a fresh
Python 3.12 venv holding torch 2.11.0 and the image's packages, and run harvest from there.

Select with `-m bundle`; it runs in the default suite too. Downloads are cached under ~/.cache/harvest/.
"""

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from conftest import free_port
from test_gpu_first_light import CARRY_LIMIT_BYTES, tracked_tree_bytes
from harvest.bundle.bundle_builder import MANIFEST_NAME, PART_BYTES, BundleSpec, build_bundle
from harvest.bundle.image_twin import make_image_twin
from harvest.worker.client import generate_prefilled
from harvest.worker.process import WorkerProcess

pytestmark = [pytest.mark.bundle]
TARGET_PYTHON = "3.12"
REPO_ROOT = Path(__file__).resolve().parents[1]
# The twin must run what the bundle installed, never this checkout.
TWIN_ENV = {"PYTHONPATH": "", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bundle") / "harvest-bundle"
    summary = build_bundle(BundleSpec(out_dir=out_dir, python_version=TARGET_PYTHON))
    yield out_dir, summary, json.loads((out_dir / MANIFEST_NAME).read_text())
    shutil.rmtree(out_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def twin(bundle, tmp_path_factory):
    """The image twin with the bundle installed into it by the bundle's own installer."""
    out_dir, _, manifest = bundle
    venv_dir = tmp_path_factory.mktemp("twin") / "venv"
    python = make_image_twin(venv_dir, TARGET_PYTHON, manifest["image_provides"])
    installed = _run([str(python), str(out_dir / "install_bundle.py"), "--python", str(python)], timeout=600)
    yield venv_dir, installed
    shutil.rmtree(venv_dir, ignore_errors=True)


def _run(argv, timeout=300, check=True):
    # Away from the checkout: `python -c` puts the working directory first on sys.path.
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **TWIN_ENV},
                         cwd="/")
    if check:
        assert out.returncode == 0, f"{argv} failed: {out.stderr[-2000:]}"
    return out


def test_parts_are_at_most_48_mib_and_match_their_checksums(bundle):
    out_dir, summary, manifest = bundle
    parts = manifest["parts"]
    assert summary["num_parts"] == len(parts) >= 1
    assert all(p["bytes"] <= PART_BYTES == 48 * 2**20 for p in parts)
    for part in parts:
        data = (out_dir / part["name"]).read_bytes()
        assert len(data) == part["bytes"] and hashlib.sha256(data).hexdigest() == part["sha256"]
    assert sum(p["bytes"] for p in parts) == manifest["payload"]["bytes"]


def test_the_whole_bundle_and_the_checkout_fit_one_device_call(bundle):
    """What the first GPU run carries in its one call: the tracked tree and every file of the bundle."""
    out_dir, _, _ = bundle
    bundle_bytes = sum(path.stat().st_size for path in out_dir.iterdir())
    assert tracked_tree_bytes() + bundle_bytes <= CARRY_LIMIT_BYTES, (tracked_tree_bytes(), bundle_bytes)


def test_bundle_carries_the_pinned_stack_repacked_and_no_torch(bundle):
    out_dir, _, manifest = bundle
    files = {w["file"] for w in manifest["wheels"]}
    assert "sglang-0.5.12-py3-none-any.whl" in files
    assert "transformers-5.6.0-py3-none-any.whl" in files and "llamafactory-0.9.5-py3-none-any.whl" in files
    assert any(f.startswith("harvest-") for f in files)
    assert not any(f.startswith(("torch-", "triton-", "nvidia_")) for f in files)
    assert "torch" not in manifest["image_provides"]
    kernel = next(f for f in files if f.startswith("sglang_kernel-"))
    assert "-0sm90-" in kernel


def test_trimmed_sglang_kernel_keeps_one_arch_and_no_fa3(bundle, tmp_path):
    out_dir, _, manifest = bundle
    subprocess.run(["bash", "-c", f"cat {out_dir}/*.part* | tar -xJ -C {tmp_path}"], check=True)
    kernel = next(tmp_path.glob("wheels/sglang_kernel-*.whl"))
    names = zipfile.ZipFile(kernel).namelist()
    # One common_ops, at the loader's fallback path, so it loads on the H100 and on this CPU host alike.
    assert [n for n in names if "common_ops" in n] == ["sgl_kernel/common_ops.abi3.so"]
    assert "sgl_kernel/spatial_ops.abi3.so" in names
    assert not [n for n in names if "flash_ops" in n or "/sm" in n or n.startswith("lib/")]
    sglang = next(tmp_path.glob("wheels/sglang-*.whl"))
    assert not [n for n in zipfile.ZipFile(sglang).namelist() if n.endswith(".so")]


def test_installer_refuses_a_damaged_part_in_one_line(bundle, tmp_path):
    out_dir, _, manifest = bundle
    copy = tmp_path / "copy"
    shutil.copytree(out_dir, copy)
    part = copy / manifest["parts"][0]["name"]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    out = subprocess.run(["python3", str(copy / "install_bundle.py"), "--target", str(tmp_path / "site")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "damaged" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.sglang
def test_offline_install_runs_harvest_and_serves_a_made_model(twin, tmp_path):
    venv_dir, installed = twin
    assert "sglang-0.5.12-py3-none-any.whl" in installed.stdout
    bin_dir = venv_dir / "bin"
    located = _run([str(bin_dir / "python"), "-c", "import harvest, sglang; print(harvest.__file__, sglang.__version__)"])
    harvest_file, sglang_version = located.stdout.split()
    assert harvest_file.startswith(str(venv_dir)) and sglang_version == "0.5.12"
    assert "model" in _run([str(bin_dir / "harvest"), "--help"]).stdout

    made = _run([str(bin_dir / "harvest"), "model", "make", "--shape", "tiny", "--random", "--dtype", "fp32",
                 "--out", str(tmp_path / "tiny")])
    assert json.loads(made.stdout)["num_parameters"] > 0
    admin_port = free_port()
    worker = WorkerProcess(["--model-path", str(tmp_path / "tiny"), "--skip-tokenizer-init", "--max-total-tokens",
                            "2048", "--admin-port", str(admin_port)], free_port(), admin_port,
                           tmp_path / "worker.log", command=[str(bin_dir / "harvest"), "serve"], env=TWIN_ENV)
    worker.start()
    try:
        async def go():
            async with httpx.AsyncClient(timeout=120) as client:
                return await generate_prefilled(client, worker.url, list(range(5, 21)), 4, room=1)

        result = asyncio.run(go())
        stats = httpx.get(f"{worker.admin_url}/harvest/stats", timeout=10).json()
    finally:
        worker.stop()
    assert len(result["output_ids"]) == 4
    assert stats["decode"]["decode_tokens"] >= 3


def _dry_run(bundle_dir, work_dir, *more):
    checkout = [sys.executable, "-m", "harvest.cli.main"]
    env = {**os.environ, "HARVEST": " ".join(checkout), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_results.sh"), "--dry-run", "--bundle",
                           str(bundle_dir), "--work", str(work_dir), *more],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT)


def test_gpu_results_dry_run_prints_the_stages_and_checks_the_inputs(bundle, tmp_path):
    """The stages in order, the bundle's parts found across folders (they arrive in separate transfers), and
    each harvest command the stages call checked the way the script will call it."""
    out_dir, _, manifest = bundle
    split = tmp_path / "split"
    shutil.copytree(out_dir, split)
    second = tmp_path / "second-transfer"
    second.mkdir()
    last = manifest["parts"][-1]["name"]
    (split / last).rename(second / last)
    num_parts = len(manifest["parts"])

    alone = _dry_run(split, tmp_path / "work")
    assert f"{num_parts - 1} of {num_parts} parts present" in alone.stdout
    assert "MISSING: bundle parts" in alone.stdout and alone.returncode == 1

    both = _dry_run(split, tmp_path / "work", "--parts-from", str(second))
    stages = [line.split()[0] for line in both.stdout.splitlines() if line.startswith("  ")]
    assert stages == ["install", "doctor", "model", "profile_solo", "worker_temporal", "profile_corun",
                      "worker_spatial", "baselines", "finetune_off", "report"]
    assert f"{num_parts} of {num_parts} parts present" in both.stdout
    checkout = [sys.executable, "-m", "harvest.cli.main"]
    for sub in ["doctor", "model", "profile", "replay", "bench", "serve"]:
        exists = subprocess.run([*checkout, sub, "--help"], capture_output=True, timeout=120).returncode == 0
        assert (f"command: harvest {sub} ok" if exists else f"MISSING: harvest {sub}") in both.stdout
    missing = [line for line in both.stdout.splitlines() if line.startswith("MISSING")]
    assert both.returncode == (1 if missing else 0)
    assert f"inputs: {len(missing)} missing" in both.stdout


def test_gpu_results_stages_resume_and_a_failed_stage_stays_pending(bundle, twin, tmp_path):
    """The install stage through the script into a --target site (the GPU host's way), done once; the model
    stage fails here (it draws on CUDA) and must stay pending, with a non-zero exit."""
    out_dir = bundle[0]
    venv_dir, _ = twin
    env = {**os.environ, **TWIN_ENV, "PYTHON": str(venv_dir / "bin" / "python"), "RESULTS": str(tmp_path / "results")}
    script = ["bash", str(REPO_ROOT / "scripts" / "gpu_results.sh"), "--bundle", str(out_dir), "--site",
              str(tmp_path / "site"), "--work", str(tmp_path / "work")]

    def stage(name):
        return subprocess.run([*script, "--only", name], capture_output=True, text=True, timeout=300, env=env,
                              cwd=REPO_ROOT)

    first = stage("install")
    assert first.returncode == 0 and "== stage install done" in first.stdout, first.stderr
    assert (tmp_path / "site" / "harvest" / "__init__.py").is_file()
    assert (tmp_path / "site" / "build" / "native" / "cpu_driver_stub" / "libcuda.so.1").is_file()
    again = stage("install")
    assert again.returncode == 0 and "== stage install" not in again.stdout

    import torch

    if torch.cuda.is_available():
        return  # the model stage would write the 16 GB model; on a GPU host scripts/gpu_results.sh runs for real
    model = stage("model")
    assert model.returncode == 1 and "stage model failed" in model.stderr
    assert sorted(p.name for p in (tmp_path / "work" / "stages").iterdir()) == ["install.done"]
