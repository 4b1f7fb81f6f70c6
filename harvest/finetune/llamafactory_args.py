"""A LlamaFactory training YAML, checked for what harvest can honour and parsed by LlamaFactory itself.

Everything is checked before any work (no model conversion, no dataset tokenization): each error names
the YAML key. Parsing goes through `llamafactory.hparams.get_train_args`, so defaults, derived values and
LlamaFactory's own consistency checks are exactly those `llamafactory-cli train` applies.

Deferred imports: the training libraries (llamafactory, transformers, peft, safetensors) are imported by the functions
that use them, so importing this module does not pay their seconds of start-up.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from base.errors import HarvestError
from harvest.finetune.job_values import check_values
from harvest.finetune.publishing import split_harvest_keys
from harvest.models import EMBEDDED_MODEL_PLACEHOLDER, resolve_model_path

# Keys whose non-default value changes the training loop in ways the layer-wise engine does not reproduce.
UNSUPPORTED_KEYS = {
    "deepspeed": "DeepSpeed",
    "fsdp": "FSDP",
    "quantization_bit": "quantized (QLoRA) base weights",
    "use_galore": "GaLore",
    "use_apollo": "APOLLO",
    "use_badam": "BAdam",
    "use_adam_mini": "Adam-mini",
    "use_muon": "Muon",
    "use_llama_pro": "LLaMA Pro",
    "pissa_init": "PiSSA initialisation",
    "neftune_noise_alpha": "NEFTune",
    "use_dft_loss": "the DFT loss",
    "use_eaft_loss": "the EAFT loss",
    "use_asft_loss": "the ASFT loss",
    "label_smoothing_factor": "label smoothing",
    "packing": "sequence packing",
    "neat_packing": "neat packing",
    "fp16": "fp16 with loss scaling (use bf16)",
    "use_unsloth": "Unsloth",
    "use_kt": "KTransformers",
    "use_hyper_parallel": "hyper-parallel",
    "streaming": "streaming datasets",
    "do_eval": "evaluation",
    "do_predict": "prediction",
    "predict_with_generate": "generation",
    "auto_find_batch_size": "automatic batch size search",
    "torch_compile": "torch.compile",
    "resume_from_checkpoint": "LlamaFactory's resume (use `harvest finetune --resume`)",
}
SUPPORTED_STAGE = "sft"
SUPPORTED_FINETUNING_TYPE = "lora"
# `template` may be left out: LlamaFactory then parses the tokenizer's chat template.
REQUIRED_KEYS = ("model_name_or_path", "dataset", "output_dir")


@dataclass(frozen=True, slots=True)
class LlamaFactoryArgs:
    """The parsed argument objects of one LlamaFactory SFT-LoRA job (LlamaFactory's own types)."""

    raw: dict[str, Any]
    """The YAML as given, after overrides and model path resolution."""
    model_args: Any
    data_args: Any
    training_args: Any
    finetuning_args: Any
    generating_args: Any
    publishing: Any = None
    """harvest's publishing keys (harvest.finetune.publishing.Publishing), None when publishing is off."""

    @classmethod
    def from_yaml(
        cls, path: str | Path, overrides: dict[str, Any] | None = None, model_path: str | None = None
    ) -> "LlamaFactoryArgs":
        path = Path(path)
        if not path.is_file():
            raise HarvestError(f"config file {str(path)!r} does not exist")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:  # PyYAML's own message spans several lines
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise HarvestError(f"config file {str(path)!r} is not valid YAML{where}: "
                               f"{getattr(e, 'problem', None) or e}") from None
        if not isinstance(raw, dict):
            raise HarvestError(f"config file {str(path)!r} must be a YAML mapping of LlamaFactory keys")
        return cls.from_dict(raw, overrides, model_path, base_dir=path.parent)

    @classmethod
    def from_dict(
        cls,
        raw: dict[str, Any],
        overrides: dict[str, Any] | None = None,
        model_path: str | None = None,
        base_dir: Path | None = None,
    ) -> "LlamaFactoryArgs":
        raw = {**raw, **(overrides or {})}
        if model_path is not None:
            raw["model_name_or_path"] = model_path
        if base_dir is not None and "dataset_dir" in raw and not Path(raw["dataset_dir"]).is_absolute():
            candidate = base_dir / raw["dataset_dir"]
            if candidate.is_dir():
                raw["dataset_dir"] = str(candidate)
        check_supported(raw)
        raw["model_name_or_path"] = str(_resolve_model(raw["model_name_or_path"]))
        llamafactory_raw, publishing = split_harvest_keys(raw)
        return cls(raw, *_parse(llamafactory_raw), publishing=publishing)

    @property
    def output_dir(self) -> Path:
        return Path(self.training_args.output_dir)


def check_supported(raw: dict[str, Any]) -> None:
    """Raise HarvestError naming the first key harvest cannot honour; does no work (no model, no data)."""
    for key in REQUIRED_KEYS:
        if raw.get(key) in (None, ""):
            raise HarvestError(f"{key}: missing from the config")
    stage = raw.get("stage", SUPPORTED_STAGE)
    if stage != SUPPORTED_STAGE:
        raise HarvestError(f"stage: {stage!r} is not supported; harvest trains stage {SUPPORTED_STAGE!r} only")
    finetuning_type = raw.get("finetuning_type", SUPPORTED_FINETUNING_TYPE)
    if finetuning_type != SUPPORTED_FINETUNING_TYPE:
        raise HarvestError(f"finetuning_type: {finetuning_type!r} is not supported; harvest trains LoRA only")
    if raw.get("do_train", True) is False:
        raise HarvestError("do_train: false leaves nothing to do; harvest finetune trains")
    for key, what in UNSUPPORTED_KEYS.items():
        value = raw.get(key)
        if value not in (None, False, 0, 0.0, "", [], {}):
            raise HarvestError(f"{key}: {what} is not supported by harvest's layer-wise engine")
    check_values(split_harvest_keys(raw)[0])
    if raw.get("template") is not None:
        _check_template(raw["template"])
    _check_dataset(raw["dataset"], raw.get("dataset_dir", "data"))
    _check_model_path(raw["model_name_or_path"])


def _check_template(template: str) -> None:
    from llamafactory.data.template import TEMPLATES

    if template not in TEMPLATES:
        raise HarvestError(f"template: {template!r} is not a LlamaFactory template (e.g. 'default', 'empty')")


def _check_dataset(dataset: str | list[str], dataset_dir: str) -> None:
    info_path = Path(dataset_dir) / "dataset_info.json"
    if not info_path.is_file():
        raise HarvestError(f"dataset_dir: {dataset_dir!r} has no dataset_info.json")
    try:
        info = json.loads(info_path.read_text())
    except json.JSONDecodeError as e:
        raise HarvestError(f"dataset_dir: {str(info_path)!r} is not valid JSON: {e}") from None
    names = dataset if isinstance(dataset, list) else [name.strip() for name in str(dataset).split(",")]
    for name in names:
        if name not in info:
            raise HarvestError(f"dataset: {name!r} is not listed in {str(info_path)!r}")
        file_name = info[name].get("file_name")
        if file_name is None:
            raise HarvestError(f"dataset: {name!r} is not a local file dataset (harvest runs offline)")
        if not (Path(dataset_dir) / file_name).exists():
            raise HarvestError(f"dataset: {name!r} points to {file_name!r}, which is not in {dataset_dir!r}")


def _check_model_path(model_path: str) -> None:
    if model_path == EMBEDDED_MODEL_PLACEHOLDER:
        return
    if not (Path(model_path).expanduser() / "config.json").is_file():
        raise HarvestError(f"model_name_or_path: {model_path!r} is not a local HF model directory (no config.json)")


def _resolve_model(model_path: str) -> Path:
    try:
        return resolve_model_path(model_path)
    except HarvestError as e:
        raise HarvestError(f"model_name_or_path: {e}") from None


def _parse(raw: dict[str, Any]) -> tuple:
    from llamafactory.hparams import get_train_args

    # harvest manages output_dir and resume itself; LlamaFactory's own checkpoint discovery must not fire.
    args = {"do_train": True, "report_to": "none", **raw, "overwrite_output_dir": True}
    try:
        return get_train_args(args)
    except (ValueError, TypeError) as e:
        raise HarvestError(f"LlamaFactory rejected the config: {e}") from None
    except SystemExit:
        raise HarvestError("LlamaFactory rejected the config (see its message above)") from None
