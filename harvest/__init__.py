"""harvest: finetune LoRA adapters inside an SGLang decode worker, on what decode leaves idle (HARLI)."""

from base.errors import HarvestError

__all__ = ["HarvestError"]
__version__ = "0.1.0"
