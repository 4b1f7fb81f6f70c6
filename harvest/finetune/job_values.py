"""A job's values against the types of LlamaFactory's own argument classes, then the ranges LlamaFactory and the
HF Trainer do not check at parse time; the first bad key is a HarvestError naming it. Parsing the job
(llamafactory_args.py) runs this before LlamaFactory's own parse, so a wrong value reads as one line.

Deferred imports: the training libraries (llamafactory, transformers, peft, safetensors) are imported by the functions
that use them, so importing this module does not pay their seconds of start-up.
"""

import types
import typing
from enum import Enum
from typing import Any

from base.errors import HarvestError

# Ranges LlamaFactory and the HF Trainer do not check at parse time: (key, test, what the value must be).
RANGES = [
    ("lora_rank", lambda v: v >= 1, ">= 1"),
    ("lora_alpha", lambda v: v is None or v > 0, "> 0"),
    ("lora_dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("learning_rate", lambda v: v > 0, "> 0"),
    ("per_device_train_batch_size", lambda v: v >= 1, ">= 1"),
    ("gradient_accumulation_steps", lambda v: v >= 1, ">= 1"),
    ("max_steps", lambda v: v >= 1 or v == -1, ">= 1 (or -1: num_train_epochs decides)"),
    ("num_train_epochs", lambda v: v > 0, "> 0"),
    ("save_steps", lambda v: v >= 0, ">= 0"),
    ("cutoff_len", lambda v: v >= 1, ">= 1"),
    ("max_samples", lambda v: v is None or v >= 1, ">= 1"),
    ("warmup_steps", lambda v: v >= 0, ">= 0"),
    ("warmup_ratio", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("weight_decay", lambda v: v >= 0, ">= 0"),
    ("max_grad_norm", lambda v: v >= 0, ">= 0"),
]


def check_values(raw: dict[str, Any]) -> None:
    """Types against LlamaFactory's own argument classes, then ranges; the first bad key is the error."""
    hints = _argument_types()
    for key, value in raw.items():
        if key in hints and not _matches(value, hints[key]):
            raise HarvestError(f"{key}: {value!r} is not {_describe(hints[key])}{_yaml_hint(value)}")
    for key, is_valid, what in RANGES:
        if raw.get(key) is not None and not is_valid(raw[key]):
            raise HarvestError(f"{key}: {raw[key]!r} must be {what}")


def _argument_types() -> dict[str, Any]:
    from llamafactory.hparams import DataArguments, FinetuningArguments, ModelArguments, TrainingArguments

    hints = {}
    for cls in (TrainingArguments, ModelArguments, DataArguments, FinetuningArguments):
        try:
            hints.update(typing.get_type_hints(cls))
        except (NameError, TypeError):  # a forward reference this check cannot resolve: LlamaFactory decides
            pass
    return hints


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:  # comma-separated lists (dataset, lora_target) may also be YAML lists
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if isinstance(hint, type) and issubclass(hint, Enum):
        return isinstance(value, hint) or value in [member.value for member in hint]
    return True  # containers and classes: LlamaFactory's parser decides


def _describe(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    return " or ".join(names.get(a, getattr(a, "__name__", str(a))) for a in args)


def _yaml_hint(value: Any) -> str:
    try:
        float(value)
    except (TypeError, ValueError):
        return ""
    return " (YAML reads a number without a dot, like 1e-3, as text: write 1.0e-3)" if isinstance(value, str) else ""
