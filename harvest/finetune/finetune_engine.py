"""FinetuneEngine: a LlamaFactory SFT-LoRA job cut into layer-sized units a scheduler runs one at a time.

LlamaFactory builds everything (tokenizer, template, dataset, PEFT model, collator) and a LlamaFactory
trainer object supplies the Trainer's own data order, optimizer, LR schedule and step count; harvest only
replaces the training loop: `next unit -> run it`, with a window of resident layers between units.
"""

import json
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from base.errors import HarvestError
from harvest.finetune.checkpoint_store import CheckpointStore
from harvest.finetune.decoder_units import (
    Chunk,
    DecoderUnits,
    get_rng_state,
    set_rng_state,
)
from harvest.finetune.finetune_config import FinetuneConfig
from harvest.finetune.layer_swapper import LayerSwapper
from harvest.finetune.llamafactory_job import LlamaFactoryJob
from harvest.finetune.training_recipe import TrainingRecipe
from harvest.finetune.unit_sizer import UnitSizer
from harvest.finetune.weight_memory import WeightMemory
from harvest.finetune.window_policy import WindowPolicy

IGNORE_INDEX = -100
UNIT_KINDS = ("embed", "forward", "head", "backward", "optimizer")


@dataclass(frozen=True, slots=True)
class UnitResult:
    kind: str
    """One of UNIT_KINDS."""
    layer_id: int | None
    chunk_id: int
    duration_ms: float
    num_tokens: int
    """Non-padding tokens the unit processed (0 for the optimizer step)."""
    step: int
    """Optimizer steps completed after this unit."""
    is_step_end: bool
    loss: float | None
    """The finished step's loss (summed over its micro-batches, as the HF Trainer logs it)."""

    @property
    def num_trained_tokens(self) -> int:
        """Tokens this unit adds to the job's count: a chunk's tokens pass every unit of its step, so only
        its embedding unit counts them."""
        return self.num_tokens if self.kind == "embed" else 0


@dataclass(frozen=True, slots=True)
class _Unit:
    kind: str
    layer_id: int | None
    chunk_id: int


class FinetuneEngine:
    def __init__(self, job: LlamaFactoryJob, config: FinetuneConfig | None = None,
                 weight_memory: WeightMemory | None = None) -> None:
        """`weight_memory` holds the resident window's frozen weights (default: torch's allocator). It is
        used only by the thread that runs units and resizes the window, never during construction."""
        config = config or FinetuneConfig()
        self.job = job
        self.config = config
        self.device = torch.device(config.device)
        self._store = CheckpointStore(job.output_dir)
        if not config.resume and self._store.latest() is not None:
            if not job.raw.get("overwrite_output_dir", False):
                raise HarvestError(
                    f"output_dir: {str(job.output_dir)!r} holds checkpoints of an earlier run; "
                    "pass --resume to continue it or set overwrite_output_dir: true"
                )
            self._store.remove_all()
        self._build(job, weight_memory)
        self._policy = WindowPolicy(self.units.num_layers)
        self._num_window_layers = self.units.num_layers
        if config.num_window_layers is not None:
            self._num_window_layers = min(config.num_window_layers, self.units.num_layers)
        self._sizer = UnitSizer(config.max_unit_ms, config.max_chunk_rows)
        self._log_path = job.output_dir / config.log_name
        self._queue: deque[_Unit] = deque()
        self._chunks: list[Chunk] = []
        self._step_loss = torch.zeros((), device=self.device)
        self._step_ms = 0.0
        self._step_tokens = 0
        self._last: dict[str, Any] = {"loss": None, "tokens_per_s": None, "grad_norm": None, "lr": None}
        self._total_tokens = 0
        self._total_ms = 0.0
        self.global_step = 0
        self._epoch, self._update_step = 0, 0
        if config.resume:
            self._resume()
        else:
            job.output_dir.mkdir(parents=True, exist_ok=True)
            self._log_path.write_text("")
        self._open_epoch(self._epoch, self._update_step * self.recipe.num_grad_accum_steps)
        self._rng_state = self._rng_state if config.resume else get_rng_state(self.device)
        self._step_boundary_rng_state = self._rng_state
        # No layer is fetched yet: a step starts with the embedding unit, after which the window fills.

    @classmethod
    def from_yaml(
        cls,
        path: str | Path,
        overrides: dict[str, Any] | None = None,
        config: FinetuneConfig | None = None,
        model_path: str | None = None,
        weight_memory: WeightMemory | None = None,
    ) -> "FinetuneEngine":
        return cls(LlamaFactoryJob.from_yaml(path, overrides, model_path), config, weight_memory)

    # ---- public API for the co-location scheduler ----

    @property
    def is_finished(self) -> bool:
        return self.global_step >= self.max_steps

    def has_ready_work(self) -> bool:
        """True when the next unit can start now: False while its layer is being fetched or waits for
        weight memory (a later unit or set_window fetches it)."""
        if self.is_finished:
            return False
        if not self._queue or self._queue[0].layer_id is None:
            return True
        return self._swapper.is_ready(self._queue[0].layer_id)

    def next_unit_kind(self) -> str:
        """The kind of unit run_next_unit would run now (a new step starts with "embed")."""
        return self._queue[0].kind if self._queue else "embed"

    def run_next_unit(self) -> UnitResult:
        if self.is_finished:
            raise RuntimeError("the finetune job is finished")
        started = time.perf_counter()
        # The job draws (dropout) from its own RNG stream, whatever the decode work between units draws.
        outer_rng_state = get_rng_state(self.device)
        set_rng_state(self.device, self._rng_state)
        try:
            unit = self._run_unit()
        finally:
            self._rng_state = get_rng_state(self.device)
            set_rng_state(self.device, outer_rng_state)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        duration_ms = (time.perf_counter() - started) * 1e3
        num_tokens = self._chunks[unit.chunk_id].num_tokens if unit.kind != "optimizer" else 0
        self._sizer.observe(unit.kind, num_tokens, duration_ms)
        self._step_ms += duration_ms
        is_step_end = unit.kind == "optimizer"
        if is_step_end:
            self._finish_step()
        return UnitResult(
            unit.kind,
            unit.layer_id,
            unit.chunk_id,
            duration_ms,
            num_tokens,
            self.global_step,
            is_step_end,
            self._last["loss"] if is_step_end else None,
        )

    def _run_unit(self) -> _Unit:
        if not self._queue:
            self._begin_step()
        unit = self._queue.popleft()
        chunk = self._chunks[unit.chunk_id]
        if unit.layer_id is not None:
            self._swapper.wait(unit.layer_id)
        if unit.kind == "embed":
            self.units.embed(chunk)
        elif unit.kind == "forward":
            self.units.forward(chunk, unit.layer_id)
        elif unit.kind == "head":
            self._step_loss += self.units.head(chunk)
        elif unit.kind == "backward":
            self.units.backward(chunk, unit.layer_id)
        else:
            self._optimizer_step()
        if unit.kind != "optimizer":
            self._apply_window()
        return unit

    def run_step(self) -> UnitResult:
        """Run units until an optimizer step completes; returns that step's last unit."""
        while True:
            result = self.run_next_unit()
            if result.is_step_end:
                return result

    @property
    def num_window_layers(self) -> int:
        return self._num_window_layers

    @property
    def num_resident_layers(self) -> int:
        """Layers resident now: the window, or fewer while the weight memory has no room for the rest."""
        return self._swapper.num_resident_layers

    def set_window(self, num_layers: int) -> None:
        """Resize the window of resident layers now (and fetch what it lacks, as memory allows): shrinking
        frees the evicted layers' storage at once. A window of 0 holds nothing; units wait for a larger one."""
        if not 0 <= num_layers <= self.units.num_layers:
            raise ValueError(f"num_layers must be in [0, {self.units.num_layers}], got {num_layers}")
        self._num_window_layers = num_layers
        self._apply_window()

    def shrink_window(self) -> bool:
        """Evict the resident layer needed last and lower the window to the layers still resident, fetching
        nothing: its memory is returned at once (the allocator's reclaim callback). False if none is resident."""
        num_resident = self._swapper.num_resident_layers
        if num_resident == 0:
            return False
        self._num_window_layers = num_resident - 1
        by_next_use = self._policy.target_layers(self._upcoming_layer_ids(), self.units.num_layers)
        self._swapper.apply([i for i in by_next_use if self._swapper.is_resident(i)][: num_resident - 1])
        return True

    def _apply_window(self) -> None:
        targets = []
        if self._num_window_layers:
            targets = self._policy.target_layers(self._upcoming_layer_ids(), self._num_window_layers)
        self._swapper.apply(targets)

    def window_bytes(self, num_layers: int) -> int:
        return self._swapper.window_bytes(num_layers)

    def save_checkpoint(self) -> Path:
        """Checkpoint the state as of the last completed step (a step in progress is redone on resume)."""
        train_state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.lr_scheduler.state_dict(),
            "rng": self._step_boundary_rng_state,
        }
        position = {"epoch": self._epoch, "update_step": self._update_step}
        return self._store.save(self.peft_model, self.global_step, position, train_state)

    def close(self) -> Path:
        """Shutdown: checkpoint, and when finished also write the adapter into output_dir like LlamaFactory.

        The engine never calls this itself: whoever drives it (`harvest finetune`, the co-location job)
        closes it once, after the last step or to stop.
        """
        checkpoint = self.save_checkpoint()
        if self.is_finished:
            self.peft_model.save_pretrained(self.job.output_dir)
        return checkpoint

    def stats(self) -> dict[str, Any]:
        state = "finished" if self.is_finished else ("running" if self.has_ready_work() else "waiting")
        return {
            "step": self.global_step,
            "max_steps": self.max_steps,
            "epoch": self._epoch,
            "loss": self._last["loss"],
            "tokens_per_s": self._last["tokens_per_s"],
            "mean_tokens_per_s": self._total_tokens / (self._total_ms / 1e3) if self._total_ms else None,
            "window": self._num_window_layers,
            "num_layers": self.units.num_layers,
            "resident_layers": self._swapper.num_resident_layers,
            "resident_bytes": self._swapper.resident_bytes(),
            "state": state,
        }

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return {k: v.detach().to("cpu").clone() for k, v in get_peft_model_state_dict(self.peft_model).items()}

    # ---- construction ----

    def _build(self, job: LlamaFactoryJob, weight_memory: WeightMemory | None) -> None:
        recipe = TrainingRecipe.build(job)
        self.recipe = recipe
        self.peft_model = recipe.peft_model
        self.tokenizer = recipe.tokenizer
        self.optimizer = recipe.optimizer
        self.lr_scheduler = recipe.lr_scheduler
        self.max_steps = recipe.max_steps
        self._trainable = [p for p in recipe.peft_model.parameters() if p.requires_grad]
        self.units = DecoderUnits(recipe.peft_model, self.device, recipe.autocast_dtype)
        for module in self.units.non_layer_modules():
            module.to(self.device)
        self._swapper = LayerSwapper(self.units.layers, self.device, weight_memory)

    # ---- the step: batches -> chunks -> units ----

    def _open_epoch(self, epoch: int, num_skip_batches: int) -> None:
        if hasattr(self.recipe.dataloader, "set_epoch"):
            self.recipe.dataloader.set_epoch(epoch)
        self._epoch_iter = iter(self.recipe.dataloader)
        for _ in range(num_skip_batches):
            next(self._epoch_iter)

    def _begin_step(self) -> None:
        if self._update_step == self.recipe.num_update_steps_per_epoch:
            self._epoch, self._update_step = self._epoch + 1, 0
            self._open_epoch(self._epoch, 0)
        recipe = self.recipe
        # As the Trainer's epoch loop: the last update step of an epoch takes what is left of it.
        remainder = recipe.num_batches_per_epoch % recipe.num_grad_accum_steps or recipe.num_grad_accum_steps
        is_last_of_epoch = self._update_step == recipe.num_update_steps_per_epoch - 1
        num_batches = remainder if is_last_of_epoch else recipe.num_grad_accum_steps
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(self._epoch_iter))
            except StopIteration:
                break
        # The HF Trainer's normalisation: with loss kwargs, token sum / labelled tokens of the whole
        # accumulation window; without, each micro-batch's mean / micro-batches in the window.
        num_items = sum(batch["labels"].ne(IGNORE_INDEX).sum() for batch in batches)
        self._chunks = []
        for batch in batches:
            batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            if self.recipe.model_accepts_loss_kwargs:
                denominator = num_items
            else:
                denominator = batch["labels"][:, 1:].ne(IGNORE_INDEX).sum() * len(batches)
            self._chunks.extend(self._split(batch, torch.as_tensor(denominator, device=self.device)))
        num_layers = self.units.num_layers
        for chunk_id in range(len(self._chunks)):
            self._queue.append(_Unit("embed", None, chunk_id))
            self._queue.extend(_Unit("forward", i, chunk_id) for i in range(num_layers))
            self._queue.append(_Unit("head", None, chunk_id))
            self._queue.extend(_Unit("backward", i, chunk_id) for i in reversed(range(num_layers)))
        self._queue.append(_Unit("optimizer", None, len(self._chunks) - 1))
        self._step_loss = torch.zeros((), device=self.device)
        self._step_ms = 0.0
        self._step_tokens = sum(chunk.num_tokens for chunk in self._chunks)

    def _split(self, batch: dict[str, Any], denominator: torch.Tensor) -> list[Chunk]:
        inputs = {k: v for k, v in batch.items() if torch.is_tensor(v)}
        num_rows, seq_len = inputs["input_ids"].shape
        rows = self._sizer.rows_per_chunk(num_rows, seq_len)
        chunks = []
        for start in range(0, num_rows, rows):
            part = {k: (v[start : start + rows] if v.shape[0] == num_rows else v) for k, v in inputs.items()}
            mask = part.get("attention_mask")
            num_tokens = int(mask.sum()) if mask is not None and mask.dim() == 2 else part["input_ids"].numel()
            chunks.append(Chunk(part, denominator, num_tokens))
        return chunks

    def _upcoming_layer_ids(self) -> list[int]:
        return [unit.layer_id for unit in self._queue if unit.layer_id is not None]

    def _optimizer_step(self) -> None:
        grad_norm = None
        if self.recipe.max_grad_norm and self.recipe.max_grad_norm > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self._trainable, self.recipe.max_grad_norm))
        self.optimizer.step()
        self._last["lr"] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._last["grad_norm"] = grad_norm
        self.global_step += 1
        self._update_step += 1

    def _finish_step(self) -> None:
        self._step_boundary_rng_state = self._rng_state
        loss = float(self._step_loss)
        self._total_tokens += self._step_tokens
        self._total_ms += self._step_ms
        self._last["loss"] = loss
        self._last["tokens_per_s"] = self._step_tokens / (self._step_ms / 1e3) if self._step_ms else None
        self._chunks = []
        record = {
            "step": self.global_step,
            "loss": loss,
            "lr": self._last["lr"],
            "grad_norm": self._last["grad_norm"],
            "num_tokens": self._step_tokens,
            "step_ms": self._step_ms,
            "tokens_per_s": self._last["tokens_per_s"],
            "window": self._num_window_layers,
        }
        with self._log_path.open("a") as log:
            log.write(json.dumps(record) + "\n")
        is_epoch_end = self._update_step == self.recipe.num_update_steps_per_epoch
        # The last step's checkpoint and the adapter are close()'s, which the caller runs once when finished.
        if not self.is_finished and (
            (self.recipe.save_every_steps and self.global_step % self.recipe.save_every_steps == 0)
            or (self.recipe.save_each_epoch and is_epoch_end)
        ):
            self.save_checkpoint()

    def _resume(self) -> None:
        checkpoint = self._store.latest()
        if checkpoint is None:
            raise HarvestError(f"--resume: no harvest checkpoint in output_dir {str(self.job.output_dir)!r}")
        position, train_state = CheckpointStore.load(checkpoint, self.peft_model)
        self.optimizer.load_state_dict(train_state["optimizer"])
        self.lr_scheduler.load_state_dict(train_state["scheduler"])
        self._rng_state = train_state["rng"]
        self.global_step = position["global_step"]
        self._epoch, self._update_step = position["epoch"], position["update_step"]
        if self._update_step == self.recipe.num_update_steps_per_epoch:
            self._epoch, self._update_step = self._epoch + 1, 0
        kept = []
        if self._log_path.is_file():
            kept = [line for line in self._log_path.read_text().splitlines() if line.strip()]
            kept = [line for line in kept if json.loads(line)["step"] <= self.global_step]
        self._log_path.write_text("".join(line + "\n" for line in kept))
