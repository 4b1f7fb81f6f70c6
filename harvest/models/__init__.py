"""Models harvest can run without a hub: the embedded SmolLM2 default and a tiny random Llama for tests."""

from harvest.models.embedded import (
    EMBEDDED_MODEL_PLACEHOLDER,
    ensure_embedded_model,
    resolve_model_path,
)

__all__ = ["EMBEDDED_MODEL_PLACEHOLDER", "ensure_embedded_model", "resolve_model_path"]
