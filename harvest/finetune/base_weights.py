"""Which base weights the job computes with: a copy of its own, or the served model's resident weights.

Sharing needs the job's base model to be the served model: same config and same weight bytes, checked by a
fingerprint, not by the path (a path can be a different snapshot or a symlink to the same one). Then every
frozen parameter of the job's PEFT model must find a served tensor of the same name, shape, dtype and value
(the served dtype is the job's when LlamaFactory would load the model in it); only then are they bound, all
at once, and the job's own loaded copy dropped. Anything short of that keeps the copy and says why.
"""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

WEIGHT_PATTERNS = ("*.safetensors", "*.bin")
PEFT_PREFIX = "base_model.model."
PEFT_WRAPPER = ".base_layer"


@dataclass(frozen=True, slots=True)
class ServedWeights:
    """The served model's resident tensors by checkpoint name (views: `model.layers.0.self_attn.q_proj.weight`
    is a slice of SGLang's fused qkv_proj), filled by harvest.sglang.served_weights. The job only reads them."""

    tensors: Mapping[str, torch.Tensor]
    reason_not_shared: str | None
    """Why no job can compute on these weights (tensor parallel, quantized); None: it can."""


def model_fingerprint(model_dir: str | Path) -> str:
    """sha256 over the model's config (as parsed JSON, keys sorted, its own path left out) and every weight
    file's bytes, in name order."""
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("_name_or_path", None)
    digest.update(json.dumps(config, sort_keys=True).encode())
    for path in sorted(p for pattern in WEIGHT_PATTERNS for p in model_dir.glob(pattern)):
        digest.update(path.name.encode())
        with path.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def base_weight_mode(job_model_dir: str | Path, served_model_dir: str | Path | None,
                     served: ServedWeights | None = None, peft_model: nn.Module | None = None,
                     device: torch.device | None = None) -> dict:
    """{mode, reason, bytes_saved, is_served_model} for the job's stats. With the served weights and the job's
    PEFT model (and the device its units run on), a job on the served model is bound to them (shared mode)
    where every check passes."""
    if served_model_dir is None:
        return _copy("no served model (a job outside a worker)", False)
    if model_fingerprint(job_model_dir) != model_fingerprint(served_model_dir):
        return _copy("the job's base model differs from the served model (config or weight fingerprint)", False)
    if served is None or peft_model is None:
        return _copy("the worker gave the job no access to its resident weights", True)
    if served.reason_not_shared is not None:
        return _copy(served.reason_not_shared, True)
    pairs, reason = _served_pairs(peft_model, served, device)
    if reason is not None:
        return _copy(reason, True)
    bytes_saved = 0
    for param, view in pairs:
        param.data = view  # the loaded copy goes with its last reference
        bytes_saved += view.numel() * view.element_size()
    return {"mode": "shared", "reason": "the job's base model is the served model: it computes on the served "
            "weights in place", "bytes_saved": bytes_saved, "is_served_model": True}


def _copy(reason: str, is_served_model: bool) -> dict:
    return {"mode": "copy", "reason": reason, "bytes_saved": 0, "is_served_model": is_served_model}


def checkpoint_name(peft_name: str) -> str:
    """`base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight` -> `model.layers.0.self_attn.q_proj.weight`"""
    return peft_name.removeprefix(PEFT_PREFIX).replace(PEFT_WRAPPER, "")


def _served_pairs(peft_model: nn.Module, served: ServedWeights, device: torch.device | None):
    """(frozen parameter, served view) for every frozen parameter, or the first reason one cannot be shared.
    Values are compared too: a served tensor SGLang reshaped or repacked after loading is not the
    checkpoint's, and neither is one cast to another dtype than the job's."""
    pairs = []
    for name, param in peft_model.named_parameters():
        if param.requires_grad:
            continue
        key = checkpoint_name(name)
        view = served.tensors.get(key)
        if view is None:
            return [], f"the served model has no tensor for the job's frozen {key}"
        if view.dtype != param.dtype:
            return [], (f"the worker serves {_dtype_name(view.dtype)}, the job loads its base model in "
                        f"{_dtype_name(param.dtype)} (LlamaFactory's compute dtype): serve with --dtype "
                        f"{_dtype_name(param.dtype)}, or set bf16/fp16 in the YAML to match")
        if device is not None and view.device != device:
            return [], f"the served weights are on {view.device}, the job runs on {device}"
        if view.shape != param.shape:
            return [], f"the served {key} is {tuple(view.shape)}, the job's is {tuple(param.shape)}"
        if not torch.equal(_to_host(view), param.data.to("cpu")):
            return [], f"the served {key} holds other values than the job's checkpoint (repacked after loading?)"
        pairs.append((param, view))
    return pairs, None


def _to_host(view: torch.Tensor) -> torch.Tensor:
    """A host copy of a served tensor, on a stream of its own: on the legacy default stream the copy would
    wait for (and hold up) the decode steps running meanwhile."""
    if view.device.type != "cuda":
        return view
    with torch.cuda.stream(torch.cuda.Stream(view.device)):
        return view.to("cpu")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
