"""Write a random-weight model of a named shape: an HF directory SGLang and LlamaFactory load, no download.

Only the weights' values differ from the real model: same config, tensor names, shapes and dtype, so a
decode step reads the same bytes and runs the same kernels.

Deferred imports: torch, transformers, tokenizers and safetensors only when a model is written; the CLI reads the shapes
and presets.
"""

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from base.errors import HarvestError
from harvest.models.model_shape import ModelShape
from harvest.models.tiny_llama import write_small_tokenizer

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
TOKENIZERS = ("none", "small")
INIT_STD = 0.02
SHARD_BYTES = 5 * 2**30
"""HF's own default shard size (save_pretrained's max_shard_size="5GB")."""
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class RandomModelSpec:
    shape: ModelShape
    out_dir: Path
    dtype: str = "bf16"
    """One of DTYPES: the serving dtype, written as is so nothing is cast at load."""
    device: str = "cpu"
    """Where the random values are drawn; a GPU draws 16 GB in well under a second."""
    tokenizer: str = "none"
    """'none': serve with --skip-tokenizer-init and send token ids; 'small': a 512-token BPE trained here,
    for jobs that tokenize text (LlamaFactory). Its ids are a subset of the model's vocabulary."""
    seed: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise HarvestError(f"--dtype {self.dtype!r}: expected one of {', '.join(DTYPES)}")
        if self.tokenizer not in TOKENIZERS:
            raise HarvestError(f"--tokenizer {self.tokenizer!r}: expected one of {', '.join(TOKENIZERS)}")


def make_random_model(spec: RandomModelSpec) -> dict:
    """Write config, sharded safetensors and their index into spec.out_dir; return what was written."""
    import torch
    from safetensors.torch import save_file

    if spec.device.startswith("cuda") and not torch.cuda.is_available():
        raise HarvestError(f"--device {spec.device}: torch sees no CUDA device on this host")
    out_dir = Path(spec.out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise HarvestError(f"--out {out_dir} exists and is not empty; give a new directory")
    # Written beside the target and renamed, so an interrupted run never looks like a model.
    partial_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial_dir, ignore_errors=True)
    partial_dir.mkdir(parents=True)
    started = time.perf_counter()

    dtype = getattr(torch, DTYPES[spec.dtype])
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    generator = torch.Generator(device=spec.device).manual_seed(spec.seed)
    shards = _plan_shards(spec.shape.tensor_shapes(), dtype_bytes)
    weight_map = {}
    for index, names in enumerate(shards, start=1):
        file_name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: _random_tensor(name, spec.shape.tensor_shapes()[name], dtype, spec.device, generator)
                   for name in names}
        save_file({name: t.cpu() for name, t in tensors.items()}, partial_dir / file_name, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file_name)
    total_bytes = spec.shape.num_parameters() * dtype_bytes
    (partial_dir / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total_bytes},
                                                      "weight_map": weight_map}, indent=1))
    config = spec.shape.hf_config(DTYPES[spec.dtype])
    if spec.tokenizer == "small":
        config |= write_small_tokenizer(partial_dir, spec.shape.vocab_size)
    (partial_dir / "config.json").write_text(json.dumps(config, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    partial_dir.rename(out_dir)
    return {
        "out_dir": str(out_dir),
        "num_parameters": spec.shape.num_parameters(),
        "weight_bytes": total_bytes,
        "decode_weight_bytes_batch1": spec.shape.decode_weight_bytes(dtype_bytes),
        "kv_bytes_per_token": spec.shape.kv_bytes_per_token(dtype_bytes),
        "num_shards": len(shards),
        "tokenizer": spec.tokenizer,
        "device": spec.device,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _plan_shards(shapes: dict[str, tuple[int, ...]], dtype_bytes: int) -> list[list[str]]:
    shards, current, current_bytes = [], [], 0
    for name, shape in shapes.items():
        nbytes = dtype_bytes
        for d in shape:
            nbytes *= d
        if current and current_bytes + nbytes > SHARD_BYTES:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(name)
        current_bytes += nbytes
    return shards + [current]


def _random_tensor(name, shape, dtype, device, generator):
    import torch

    if name.endswith("norm.weight"):
        # RMSNorm gains of 1 as HF initialises them, so activations keep a sane scale through 32 layers.
        return torch.ones(shape, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, INIT_STD, generator=generator)

