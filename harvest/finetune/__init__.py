"""The layer-wise LoRA finetune engine: LlamaFactory jobs cut into units a decode scheduler interleaves."""

from harvest.finetune.finetune_config import FinetuneConfig
from harvest.finetune.finetune_engine import FinetuneEngine, UnitResult

__all__ = ["FinetuneConfig", "FinetuneEngine", "UnitResult"]
