"""A complete LlamaFactory job on the tiny random Llama and the demo dataset, for tests and the CPU bench."""

import hashlib
from pathlib import Path
from typing import Any

import yaml

from harvest.finetune.demo.make_dataset import DATASET_NAME, DEMO_DIR
from harvest.models.tiny_llama import build_tiny_llama

# `default` is a plain LlamaFactory template ("Human: ...\nAssistant: ...") that needs no special tokens,
# so it renders with the tiny Llama's trained BPE tokenizer as well as with SmolLM2's.
TINY_JOB = {
    "stage": "sft",
    "do_train": True,
    "finetuning_type": "lora",
    "lora_rank": 4,
    "lora_target": "all",
    "dataset": DATASET_NAME,
    "dataset_dir": str(DEMO_DIR),
    "template": "default",
    "cutoff_len": 64,
    "max_samples": 64,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "learning_rate": 1.0e-3,
    "max_steps": 5,
    "logging_steps": 1,
    "save_steps": 100,
    "report_to": "none",
    "overwrite_output_dir": True,
    "seed": 42,
}


def write_tiny_job(work_dir: str | Path, num_layers: int = 2, **overrides: Any) -> Path:
    """Build (or reuse) a tiny Llama under work_dir and write a job YAML next to it; returns the YAML path."""
    work_dir = Path(work_dir)
    model_dir = build_tiny_llama(work_dir / f"tiny-llama-{num_layers}l", num_hidden_layers=num_layers)
    job = {**TINY_JOB, "model_name_or_path": str(model_dir), "output_dir": str(work_dir / "out"), **overrides}
    text = yaml.safe_dump(job, sort_keys=True)
    path = work_dir / f"job-{hashlib.sha1(text.encode()).hexdigest()[:10]}.yaml"
    path.write_text(text)
    return path
