"""Publishing the adapter being trained: the job YAML's harvest keys for it, and the adapter as SGLang's
LoRA loader takes it from tensors (PEFT's names and config, no file).

Deferred imports: the training libraries (llamafactory, transformers, peft, safetensors) are imported by the functions
that use them, so importing this module does not pay their seconds of start-up.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.errors import HarvestError

# harvest's own keys in a LlamaFactory job YAML; they are taken out before LlamaFactory parses it.
HARVEST_KEYS = ("publish_every_steps", "publish_name")


@dataclass(frozen=True, slots=True)
class Publishing:
    every_steps: int | None
    """Publish every this many optimizer steps (`publish_every_steps`); None: only on request (admin API)."""
    name: str
    """The LoRA name requests give in SGLang's `lora_path` (`publish_name`; default: output_dir's name)."""


def split_harvest_keys(raw: dict[str, Any]) -> tuple[dict[str, Any], Publishing | None]:
    """(the YAML without harvest's keys, its Publishing or None when publishing is off)."""
    every = raw.get("publish_every_steps")
    name = raw.get("publish_name")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise HarvestError(f"publish_every_steps: {every!r} must be an integer >= 1")
    if name is not None and (not isinstance(name, str) or not name.strip() or name != name.strip()):
        raise HarvestError(f"publish_name: {name!r} must be a non-empty name without surrounding spaces")
    rest = {k: v for k, v in raw.items() if k not in HARVEST_KEYS}
    if every is None and name is None:
        return rest, None
    default_name = Path(str(raw.get("output_dir", "adapter"))).name or "adapter"
    return rest, Publishing(every, name or default_name)


def adapter_tensors(peft_model) -> dict:
    """The adapter's LoRA tensors under PEFT's saved names, detached copies on the host (training goes on)."""
    from peft import get_peft_model_state_dict

    # names: base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight, as adapter_model.safetensors
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}


def adapter_config_dict(peft_model) -> dict:
    """PEFT's adapter_config.json content, as SGLang's LoRAConfig.from_dict reads it (JSON-safe)."""
    config = peft_model.peft_config["default"].to_dict()
    return json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))
