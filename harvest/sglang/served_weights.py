"""The served model's resident weights under their checkpoint names, as views: what a finetune job on the same
model computes with instead of loading a copy (harvest.finetune.base_weights).

SGLang's Llama-style models fuse q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (one matmul each);
the checkpoint, and so the PEFT model, keeps them apart. Each fused weight is split back into row slices,
`narrow` views of the one resident tensor (a Linear weight is [out_features, in_features], the fused
outputs stacked along dim 0), so nothing is copied. Vocabulary tensors are cut to the checkpoint's rows
(SGLang pads the vocabulary to a multiple of 64).
"""

import torch
from torch import nn

from harvest.finetune.base_weights import ServedWeights

LORA_WRAPPER = ".base_layer"
"""SGLang's LoRA layers (--enable-lora) wrap the served layer and keep it under this name (the wrapper also
holds its weight as its own)."""


def served_weights(model_runner) -> ServedWeights:
    """The worker's model (`Scheduler.tp_worker.model_runner`) as a ServedWeights; its `reason_not_shared`
    says why a job cannot compute on it, where it cannot."""
    reason = _reason_not_shared(model_runner)
    if reason is not None:
        return ServedWeights({}, reason)
    try:
        return ServedWeights(_checkpoint_views(model_runner.model), None)
    except Exception as e:  # noqa: BLE001 - a model laid out otherwise keeps the job in copy mode, serving goes on
        return ServedWeights({}, f"the served {type(model_runner.model).__name__} does not map to checkpoint "
                             f"names ({type(e).__name__}: {e})")


def _checkpoint_views(model: nn.Module) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        module = getattr(module, LORA_WRAPPER.lstrip("."), module)  # the served layer inside a LoRA wrapper
        module_name = module_name.replace(LORA_WRAPPER, "")
        # detach: a view with no autograd history; the job's frozen parameters never get gradients.
        for checkpoint_module, view in _split(module_name, module, attr, param.detach()):
            tensors[f"{checkpoint_module}.{attr}"] = view
    return tensors


def _reason_not_shared(model_runner) -> str | None:
    """Where the served tensors are not the checkpoint's tensors, sharing is impossible: say why."""
    if model_runner.tp_size != 1:
        return f"tensor parallel (--tp {model_runner.tp_size}): this worker holds a shard of each weight"
    quantization = model_runner.model_config.quantization
    if quantization:
        return f"the worker serves quantized weights ({quantization}); the job trains on the checkpoint's"
    return None


def _split(module_name: str, module: nn.Module, attr: str, tensor: torch.Tensor):
    """(checkpoint module name, view) pairs for one served parameter."""
    parent, _, leaf = module_name.rpartition(".")
    if leaf == "qkv_proj":
        sizes = [module.q_proj_shard_size, module.kv_proj_shard_size, module.v_proj_shard_size]
        # weight: [q + k + v, hidden]; bias: [q + k + v]
        return zip((f"{parent}.q_proj", f"{parent}.k_proj", f"{parent}.v_proj"), tensor.split(sizes, dim=0))
    if leaf == "gate_up_proj":
        # weight: [2 * intermediate, hidden]
        return zip((f"{parent}.gate_proj", f"{parent}.up_proj"), tensor.split(list(module.output_sizes), dim=0))
    if hasattr(module, "org_vocab_size"):
        # embed_tokens / lm_head weight: [padded vocab, hidden] -> [vocab, hidden]
        return [(module_name, tensor.narrow(0, 0, module.org_vocab_size))]
    return [(module_name, tensor)]
