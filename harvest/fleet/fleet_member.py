"""A finetune engine joined to its fleet: the adapter's tensors by name, the job's fingerprint every member must
share, and the join itself (FleetSync)."""

import hashlib
import json
from pathlib import Path

import torch

from harvest.fleet.fleet_config import FleetConfig
from harvest.fleet.fleet_sync import FleetSync
from harvest.fleet.round_checkpoint import latest_round_checkpoint

JOB_KEYS = ("stage", "finetuning_type", "lora_rank", "lora_alpha", "lora_target", "dataset", "template",
            "cutoff_len", "learning_rate", "optim", "lr_scheduler_type", "max_steps", "per_device_train_batch_size",
            "gradient_accumulation_steps")
"""The YAML keys that make two workers' training the same job (output_dir and the data shard may differ)."""
MODEL_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size")


def trainable_named_params(engine) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (without the adapter's name, as adapter_tensors)."""
    return {name.replace(".default", ""): p for name, p in engine.peft_model.named_parameters() if p.requires_grad}


def job_fingerprint(engine) -> int:
    """20 bits (exact in the float64 sums of the fleet's check) over the job's training keys, the base model's
    shape, a slice of its embedding's values (two checkpoints of one architecture differ there) and the adapter's
    tensor names and shapes."""
    raw = engine.llamafactory.raw
    base = engine.peft_model.get_base_model()
    config = base.config.to_dict()
    embedding = base.get_input_embeddings().weight.detach()[:4].to("cpu", torch.float32)
    described = json.dumps([{k: raw.get(k) for k in JOB_KEYS}, {k: config.get(k) for k in MODEL_KEYS},
                            [(n, list(p.shape)) for n, p in trainable_named_params(engine).items()]],
                           sort_keys=True, default=str)
    digest = hashlib.sha256(described.encode() + embedding.numpy().tobytes()).hexdigest()
    return int(digest[:5], 16)


def round_checkpoint_dir(engine, config: FleetConfig) -> Path:
    """Where the fleet's rounds are written and resumed from: --fleet-checkpoint-dir (shared by the members),
    else the job's output_dir/fleet-rounds."""
    return Path(config.checkpoint_dir) if config.checkpoint_dir else engine.llamafactory.output_dir / "fleet-rounds"


def join_fleet(engine, config: FleetConfig) -> tuple[FleetSync, list[str]]:
    """Join (blocks until the first round forms), starting from the newest round checkpointed (a fleet
    restarted whole resumes from it); returns the member and the adapter's tensor names, in the order of its
    flat vector. The member's checkpoint_dir is where its rounds go."""
    named = trainable_named_params(engine)
    checkpoint_dir = round_checkpoint_dir(engine, config)
    fleet = FleetSync(list(named.values()), config.policy, config.lighthouse, config.replica_id,
                      config.min_members, config.timeout_s, job_fingerprint(engine),
                      latest_round_checkpoint(checkpoint_dir, list(named)))
    fleet.checkpoint_dir = checkpoint_dir
    return fleet, list(named)
