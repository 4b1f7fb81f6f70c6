"""Acceptance (unified allocator, end to end on CPU): the real SGLang decode worker with the finetune job's
weight window in lent KV chunks gives, under a concurrent burst that needs those chunks back, token for
token the same greedy outputs as the same worker with lending off; the job keeps training around it."""

import asyncio
import concurrent.futures
import os
import time

import httpx
import pytest
import yaml
from conftest import free_port
from faults.figures import record

from harvest.finetune.demo.make_dataset import DATASET_NAME, DEMO_DIR
from harvest.worker.client import generate_prefilled, read_stats, wait_for_stats
from harvest.worker.process import WorkerProcess

pytestmark = pytest.mark.sglang

# The tiny Llama's KV rows are 64 bytes (2 heads x 16 dims, fp16): 64 KiB blocks give chunks of 1024 slots,
# and 8192 tokens of KV give 9 chunks; the job's window takes the top two. The burst needs
# 7 x (1100 + 16 new + 16 reserved) slots: more than KV has free while the window is lent, less than the
# whole pool, so the last requests' prompts land in reclaimed chunks (new KV takes the lowest free slots).
KV_FLAGS = ["--max-total-tokens", "8192", "--kv-block-kib", "64", "--num-reserved-decode-tokens", "16"]
NUM_REQUESTS, INPUT_LEN, MAX_NEW_TOKENS = 7, 1100, 16


def write_job(tmp_path, model_dir):
    job = {
        "model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": 8, "lora_target": "all", "dataset": DATASET_NAME, "dataset_dir": str(DEMO_DIR),
        "template": "default", "cutoff_len": 64, "max_samples": 256, "per_device_train_batch_size": 2,
        "learning_rate": 1.0e-3, "max_steps": 100_000, "save_steps": 100_000,
        "output_dir": str(tmp_path / "adapter"), "overwrite_output_dir": True, "report_to": "none", "seed": 42,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


async def burst(url: str) -> list[list[int]]:
    async with httpx.AsyncClient(timeout=300) as client:
        results = await asyncio.gather(*(
            generate_prefilled(client, url, [(7 * i + j) % 500 + 3 for j in range(INPUT_LEN)], MAX_NEW_TOKENS, i)
            for i in range(NUM_REQUESTS)))
    return [r["output_ids"] for r in results]


def run_burst(model_dir, tmp_path, name, *extra) -> tuple[list[list[int]], dict, dict]:
    (tmp_path / name).mkdir()
    job = write_job(tmp_path / name, model_dir)
    args = ["--model-path", str(model_dir), *KV_FLAGS, "--finetune", str(job), "--tpot-slo-ms", "500", *extra]
    with WorkerProcess(args, free_port(), free_port(), tmp_path / f"{name}.log") as worker:
        before = wait_for_stats(worker.admin_url, lambda s: s["finetune"].get("step", 0) >= 3, "finetune steps")
        if "--no-kv-lending" not in extra:
            before = wait_for_stats(worker.admin_url, lambda s: s["memory"]["chunks_lent"] > 0, "a lent chunk")
        outputs = asyncio.run(burst(worker.url))
        time.sleep(1.0)  # the lender's stats copy refreshes every 0.5 s
        after = read_stats(worker.admin_url)
    return outputs, before, after


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a core partition needs two cores")
def test_greedy_outputs_are_the_same_with_kv_lent_and_reclaimed(tiny_model_dir, tmp_path):
    """Spatial co-location on core sets (decode on one core, units on the other) lends as temporal does: the
    burst's reclaim gives the outputs of `--no-kv-lending`. (Temporal: tests/test_pd_deploy.py's burst, through
    a real PD deployment, against plain SGLang.)"""
    # The two workers run side by side (greedy outputs do not depend on timing): one start-up's wait, not two.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        lending_off = pool.submit(run_burst, tiny_model_dir, tmp_path, "lending-off", "--no-kv-lending",
                                  "--no-finetune-compile")
        lending_on = pool.submit(run_burst, tiny_model_dir, tmp_path, "spatial-lending-on", "--pin-partition", "1,1")
        (reference, _, off), (outputs, before, after) = lending_off.result(), lending_on.result()
    assert off["memory"]["kv_lending"].startswith("off") and "chunks_lent" not in off["memory"]
    memory, colocation = after["memory"], after["colocation"]
    assert before["memory"]["kv_lending"] == "on" and colocation["mode"] == "spatial"
    top_chunk_first_slot = (memory["chunks_total"] - 2) * 1024
    assert NUM_REQUESTS * (INPUT_LEN + MAX_NEW_TOKENS) > top_chunk_first_slot, "the burst must reach lent chunks"
    record("KV burst with lending", requests=NUM_REQUESTS,
           requests_failed=sum(len(o) != MAX_NEW_TOKENS for o in outputs),
           outputs_equal_no_kv_lending=outputs == reference,
           chunks_reclaimed=memory["num_reclaimed_chunks"], job_state=after["finetune"]["state"])
    # Every decode step ran on the (1, 1) core partition; whether units co-ran depends on the job having its
    # layers while the burst takes lent KV back (it mostly waits for them), so only the steps are asserted.
    assert colocation["co_run"]["1,1"]["steps"] > 0, f"no step ran on the (1, 1) partition: {colocation['co_run']}"
    assert memory["num_reclaimed_chunks"] > 0, f"the burst never needed lent KV back: {memory}"
    assert [len(o) for o in outputs] == [MAX_NEW_TOKENS] * NUM_REQUESTS
    assert outputs == reference
    assert after["finetune"]["state"] in ("running", "waiting", "starved")
    # The job's layers ran compiled (harvest serve's default on a CPU host): graphs for the unit thread's one core
    # and the whole device's two, and no unit found none.
    compiled = after["finetune"]["compiled_layers"]
    assert {1, 2} <= set(compiled["thread_counts"]) and compiled["eager_calls"] == 0, compiled
