"""The layer-wise LoRA finetune engine: LlamaFactory jobs cut into units a decode scheduler interleaves."""

from harvest.finetune.finetune_config import FinetuneConfig

__all__ = ["FinetuneConfig", "FinetuneEngine", "UnitResult"]


def __getattr__(name: str):
    if name in ("FinetuneEngine", "UnitResult"):
        # deferred: the engine imports torch; the config is read by `harvest serve`'s flag parsing, which must not.
        from harvest.finetune import finetune_engine

        return getattr(finetune_engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
