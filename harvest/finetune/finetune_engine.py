"""FinetuneEngine: a LlamaFactory SFT-LoRA job cut into layer-sized units a scheduler runs one at a time.

LlamaFactory builds everything (tokenizer, template, dataset, PEFT model, collator) and a LlamaFactory
trainer object supplies the Trainer's own data order, optimizer, LR schedule and step count; harvest only
replaces the training loop: `next unit -> run it`, with a window of resident layers between units, or,
when the job's base model is the worker's served model, on the served weights in place (shared mode: no
copy, no window; harvest.finetune.base_weights).
"""

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from base.errors import HarvestError
from harvest.finetune.base_weights import ServedWeights, base_weight_mode
from harvest.finetune.checkpoint_store import CheckpointStore
from harvest.finetune.decoder_units import DecoderUnits, global_rng_state
from harvest.finetune.finetune_config import FinetuneConfig
from harvest.finetune.layer_swapper import LayerSwapper
from harvest.finetune.llamafactory_args import LlamaFactoryArgs
from harvest.finetune.optimizer_parts import OptimizerParts
from harvest.finetune.served_layers import ServedLayers
from harvest.finetune.step_log import StepLog
from harvest.finetune.step_queue import UPDATE_KINDS, StepQueue, Unit
from harvest.finetune.training_setup import TrainingSetup
from harvest.finetune.unit_sizer import UnitSizer
from harvest.finetune.unit_warmup import warm_up_units
from harvest.finetune.weight_memory import WeightMemory
from harvest.finetune.window_policy import WindowPolicy

logger = logging.getLogger(__name__)

UNIT_KINDS = ("embed", "forward", "head", "recompute", "backward", "grad_norm", "optimizer", "checkpoint")
""""grad_norm" and "optimizer": the optimizer update, whole or in parts (OptimizerParts); "checkpoint": an update's
last unit whose step end writes a checkpoint, timed as its own kind (with the write)."""


@dataclass(frozen=True, slots=True)
class UnitResult:
    kind: str
    """One of UNIT_KINDS."""
    layer_id: int | None
    slice_id: int
    duration_ms: float
    num_tokens: int
    """Non-padding tokens the unit processed (0 for the optimizer update's units)."""
    step: int
    """Optimizer steps completed after this unit."""
    is_step_end: bool
    loss: float | None
    """The finished step's loss (summed over its micro-batches, as the HF Trainer logs it)."""

    @property
    def num_trained_tokens(self) -> int:
        """Tokens this unit adds to the job's count: a row slice's tokens pass every unit of its step, so only
        its embedding unit counts them."""
        return self.num_tokens if self.kind == "embed" else 0


class FinetuneEngine:
    def __init__(self, llamafactory: LlamaFactoryArgs, config: FinetuneConfig | None = None,
                 weight_memory: WeightMemory | None = None, served_weights: ServedWeights | None = None) -> None:
        """`weight_memory` holds the resident window's frozen weights (default: torch's allocator). It is
        used only by the thread that runs units and resizes the window, never during construction.
        `served_weights`: the worker's resident weights, computed on in place if the job's base model is the
        served model (config.served_model_path); the window and weight_memory then go unused."""
        config = config or FinetuneConfig()
        self.llamafactory = llamafactory
        self.config = config
        self.device = torch.device(config.device)
        self._store = CheckpointStore(llamafactory.output_dir)
        if not config.resume and self._store.latest() is not None:
            if not llamafactory.raw.get("overwrite_output_dir", False):
                raise HarvestError(
                    f"output_dir: {str(llamafactory.output_dir)!r} holds checkpoints of an earlier run; "
                    "pass --resume to continue it or set overwrite_output_dir: true"
                )
            self._store.remove_all()
        self._build(llamafactory, weight_memory, served_weights)
        self._policy = WindowPolicy(self.units.num_layers)
        self._num_window_layers = self.units.num_layers
        if config.num_window_layers is not None and not self.is_shared:
            self._num_window_layers = min(config.num_window_layers, self.units.num_layers)
        self._sizer = UnitSizer(config.max_unit_ms, config.max_slice_rows)
        self._queue = StepQueue(self.setup, self._sizer, self.device, self.units.num_layers, self._optimizer,
                                self.units.max_head_vocab_parts)
        self._step_loss = torch.zeros((), device=self.device)
        self._step_ms = 0.0
        self._update_ms = 0.0
        self._head_pass_ms = [0.0, 0.0]
        self._step_tokens = 0
        self._recomputed_residency: int | None = None
        self.num_recomputed_again = 0
        """Backward units that recomputed their layer again: it was evicted after its recompute unit."""
        self.global_step = 0
        position = self._resume() if config.resume else {"epoch": 0, "update_step": 0}
        self._log = StepLog(llamafactory.output_dir / config.log_name,
                            resumed_step=self.global_step if config.resume else None)
        self._queue.start(position["epoch"], position["update_step"])
        if not config.resume:
            self.generator.set_state(global_rng_state(self.device))
            self._cpu_rng_state = torch.get_rng_state()
        self._step_boundary_rng_state = self._rng_states()
        self.warmup_ms: float | None = None
        """The warm-up's time while the engine was built (unit_warmup.py); None: not warmed up."""
        self.warmup_unit_ms: dict[str, float] = {}
        """Each unit kind's time in the warm-up: its first run in the process."""
        if config.warm_up_units:
            started = time.perf_counter()
            can_split_head = config.max_unit_ms is not None and self.units.max_head_vocab_parts >= 2
            self.warmup_unit_ms = warm_up_units(self.units, self._swapper, self._optimizer,
                                                self.setup.dataloader.collate_fn, can_split_head)
            self.warmup_ms = (time.perf_counter() - started) * 1e3
        if self.units.eager_reason is not None:
            logger.warning("harvest: the job's layers run eagerly: %s", self.units.eager_reason)
        # No layer is fetched yet: a step starts with the embedding unit, after which the window fills.

    @classmethod
    def from_yaml(
        cls,
        path: str | Path,
        overrides: dict[str, Any] | None = None,
        config: FinetuneConfig | None = None,
        model_path: str | None = None,
        weight_memory: WeightMemory | None = None,
        served_weights: ServedWeights | None = None,
    ) -> "FinetuneEngine":
        return cls(LlamaFactoryArgs.from_yaml(path, overrides, model_path), config, weight_memory, served_weights)

    # ---- public API for the co-location scheduler ----

    @property
    def is_shared(self) -> bool:
        """Computing on the served model's weights in place: there is no window to resize or lend memory to."""
        return self.base_weights["mode"] == "shared"

    @property
    def is_finished(self) -> bool:
        return self.global_step >= self.max_steps

    def has_ready_work(self) -> bool:
        """True when the next unit can start now: False while its layer is being fetched or waits for
        weight memory (a later unit or set_window fetches it)."""
        if self.is_finished:
            return False
        unit = self._queue.peek()
        if unit is None or unit.layer_id is None:
            return True
        return self._swapper.is_ready(unit.layer_id)

    def next_unit_kind(self) -> str:
        """The kind of unit run_next_unit would run now (a new step starts with "embed")."""
        unit = self._queue.peek()
        if unit is None:
            return "embed"
        if unit.is_step_end and self._is_save_step(self.global_step + 1):
            return "checkpoint"
        return unit.kind

    def next_unit_predicted_ms(self) -> float | None:
        """What the unit sizer's line says the unit run_next_unit would run now takes, at its size (None: not
        timed yet, a kind without a size, or a new step, whose units are not cut yet): a slice admits it at this
        times its kind's spread around the line (UnitTimes), not at its kind's longest size."""
        unit = self._queue.peek()
        if unit is None or (unit.is_step_end and self._is_save_step(self.global_step + 1)):
            return None
        return self._sizer.predict_ms(unit.kind, self._queue.num_unit_positions(unit),
                                      vocab_parts=0 if unit.vocab_part is None else unit.vocab_part[1],
                                      optimizer_parts=0 if unit.param_part is None else unit.param_part[1])

    @property
    def max_unit_ms(self) -> float | None:
        """What the units planned now are sized to stay under (None: not split on time)."""
        return self._sizer.max_unit_ms

    def set_unit_bound(self, max_unit_ms: float) -> None:
        """Size units to `max_unit_ms` from the next optimizer step on (the units of the step in progress were
        planned whole with their rows). Only for an engine split on time (config.max_unit_ms set)."""
        if self.config.max_unit_ms is None:
            raise RuntimeError("the engine's units are not split on time (config.max_unit_ms is None)")
        if max_unit_ms <= 0:
            raise ValueError(f"max_unit_ms must be > 0, got {max_unit_ms}")
        self._sizer.max_unit_ms = max_unit_ms

    @property
    def is_mid_update(self) -> bool:
        """Part of the optimizer update is applied and part is not: the adapter is neither the last step's nor
        the next one's, so it may not be checkpointed or published until the update's last part has run."""
        unit = self._queue.peek()
        return unit is not None and unit.param_part is not None and unit.param_part[0] > 0

    def run_next_unit(self) -> UnitResult:
        if self.is_finished:
            raise RuntimeError("the finetune job is finished")
        started = time.perf_counter()
        # The data loader draws (its base seed) from torch's global CPU generator: the job keeps its own CPU
        # state. Swapping that one is safe: decode samples on the device's generator (or, on a CPU worker, in
        # this same thread); the device's global generator is never swapped (dropout uses self.generator).
        outer_cpu_state = torch.get_rng_state()
        torch.set_rng_state(self._cpu_rng_state)
        try:
            unit = self._run_unit()
        finally:
            self._cpu_rng_state = torch.get_rng_state()
            torch.set_rng_state(outer_cpu_state)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        duration_ms = (time.perf_counter() - started) * 1e3
        num_tokens = self._queue.num_unit_tokens(unit)
        num_positions = self._queue.num_unit_positions(unit)
        if unit.vocab_part is None:
            self._sizer.observe(unit.kind, num_positions, duration_ms)
        else:
            # A head over K vocabulary chunks is timed whole, its 2K units summed, once its last one has run,
            # with the share of its heavier pass (logits or gradient), which is what K is cut by.
            j, num_parts = unit.vocab_part
            self._head_pass_ms[j // num_parts] += duration_ms
            if j == 2 * num_parts - 1:
                self._sizer.observe_split_head(num_positions, *self._head_pass_ms)
                self._head_pass_ms = [0.0, 0.0]
        self._step_ms += duration_ms
        is_step_end = unit.is_step_end
        if unit.param_part is not None:
            self._update_ms += duration_ms
            if is_step_end:
                self._sizer.observe_optimizer(self._update_ms)
                self._update_ms = 0.0
        kind = unit.kind
        if is_step_end and self._finish_step():
            # The write is part of what the slice waits for: timed, under its own kind.
            kind = "checkpoint"
            duration_ms = (time.perf_counter() - started) * 1e3
        return UnitResult(
            kind,
            unit.layer_id,
            unit.slice_id,
            duration_ms,
            num_tokens,
            self.global_step,
            is_step_end,
            self._log.last["loss"] if is_step_end else None,
        )

    def _run_unit(self) -> Unit:
        is_new_step = self._queue.peek() is None
        unit = self._queue.pop()
        if is_new_step:
            self._step_loss = torch.zeros((), device=self.device)
            self._step_ms = 0.0
            self._step_tokens = self._queue.num_step_tokens
        row_slice = self._queue.slices[unit.slice_id]
        if unit.layer_id is not None:
            self._swapper.wait(unit.layer_id)
        if unit.kind == "embed":
            self.units.embed(row_slice)
        elif unit.kind == "forward":
            self.units.forward(row_slice, unit.layer_id)
        elif unit.kind == "head" and unit.vocab_part is None:
            self._step_loss += self.units.head(row_slice, unit.span)
        elif unit.kind == "head":
            self._step_loss += self.units.head_part(row_slice, unit.span, unit.vocab_part)
        elif unit.kind == "recompute":
            self.units.recompute(row_slice, unit.layer_id)
            self._recomputed_residency = self._swapper.residency(unit.layer_id)
        elif unit.kind == "backward":
            if row_slice.recomputed is not None and \
                    self._swapper.residency(unit.layer_id) != self._recomputed_residency:
                # The layer was evicted since its recompute unit (its memory lent back to decode): the graph
                # points at weights that moved, so the layer is recomputed on the ones resident now.
                row_slice.recomputed = None
                self.num_recomputed_again += 1
            self.units.backward(row_slice, unit.layer_id)
        elif unit.kind == "grad_norm":
            self._optimizer.take_grad_norm()
        elif unit.param_part is None:
            self._end_update(self._optimizer.step())
        else:
            grad_norm = self._optimizer.step_part(*unit.param_part)
            if unit.is_step_end:
                self._end_update(grad_norm)
        if unit.kind not in UPDATE_KINDS:
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
        if self.is_shared:
            return  # every layer is the served model's, resident whatever the window
        self._num_window_layers = num_layers
        self._apply_window()

    def shrink_window(self) -> bool:
        """Evict the resident layer needed last and lower the window to the layers still resident, fetching
        nothing: its memory is returned at once (the allocator's reclaim callback). False if none is resident."""
        num_resident = self._swapper.num_resident_layers
        if num_resident == 0 or self.is_shared:
            return False
        self._num_window_layers = num_resident - 1
        by_next_use = self._policy.target_layers(self._queue.upcoming_layer_ids(), self.units.num_layers)
        self._swapper.apply([i for i in by_next_use if self._swapper.is_resident(i)][: num_resident - 1])
        return True

    def _apply_window(self) -> None:
        targets = []
        if self._num_window_layers:
            targets = self._policy.target_layers(self._queue.upcoming_layer_ids(), self._num_window_layers)
        self._swapper.apply(targets)

    def window_bytes(self, num_layers: int) -> int:
        return self._swapper.window_bytes(num_layers)

    def frozen_bytes(self) -> int:
        """Bytes of frozen weights the job holds itself, measured over its tensors: its layers' host copies, its
        resident window and the weights outside the layers (embeddings, norms, head); storage that is the
        served model's counts nothing."""
        storages = {}
        for param in self.peft_model.parameters():
            if not param.requires_grad:
                storage = param.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        held = sum(nbytes for ptr, nbytes in storages.items() if ptr not in self._served_storage_ptrs)
        return held + self._swapper.host_bytes()

    def save_checkpoint(self) -> Path:
        """Checkpoint the state as of the last completed step (a step in progress is redone on resume; one whose
        optimizer update is part-applied is finished first, the few parts left: its weights are neither step's)."""
        while self.is_mid_update:
            self.run_next_unit()
        train_state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.lr_scheduler.state_dict(),
            "rng": self._step_boundary_rng_state,
        }
        position = {"epoch": self._queue.epoch, "update_step": self._queue.update_step}
        return self._store.save(self.peft_model, self.global_step, position, train_state)

    def close(self) -> Path:
        """Shutdown: checkpoint, and when finished also write the adapter into output_dir like LlamaFactory.

        The engine never calls this itself: whoever drives it (`harvest finetune`, the co-location job)
        closes it once, after the last step or to stop.
        """
        checkpoint = self.save_checkpoint()
        if self.is_finished:
            self.peft_model.save_pretrained(self.llamafactory.output_dir)
        return checkpoint

    def stats(self) -> dict[str, Any]:
        state = "finished" if self.is_finished else ("running" if self.has_ready_work() else "waiting")
        return {
            "step": self.global_step,
            "max_steps": self.max_steps,
            "epoch": self._queue.epoch,
            "loss": self._log.last["loss"],
            "tokens_per_s": self._log.last["tokens_per_s"],
            "mean_tokens_per_s": self._log.mean_tokens_per_s,
            "window": self._num_window_layers,
            "num_layers": self.units.num_layers,
            "resident_layers": self._swapper.num_resident_layers,
            "resident_bytes": self._swapper.resident_bytes(),
            "frozen_bytes": self.frozen_bytes(),
            "recomputed_again": self.num_recomputed_again,
            "max_unit_ms": self._sizer.max_unit_ms,
            "unit_overrun": self._sizer.overruns(),
            "unit_cost": self._sizer.costs(),
            "slice_rows": [len(row_slice.inputs["input_ids"]) for row_slice in list(self._queue.slices)],
            "base_weights": self.base_weights,
            "warmup_ms": None if self.warmup_ms is None else round(self.warmup_ms, 3),
            "warmup_unit_ms": {kind: round(ms, 3) for kind, ms in self.warmup_unit_ms.items()},
            "compiled_layers": (self.units.compiled.stats() if self.units.compiled is not None
                                else None if self.units.eager_reason is None else {"eager": self.units.eager_reason}),
            "state": state,
        }

    # ---- construction ----

    def _build(self, llamafactory: LlamaFactoryArgs, weight_memory: WeightMemory | None,
               served_weights: ServedWeights | None) -> None:
        setup = TrainingSetup.build(llamafactory, self.config.data_shard)
        self.base_weights = base_weight_mode(llamafactory.raw["model_name_or_path"], self.config.served_model_path,
                                             served_weights, setup.peft_model, self.device)
        self.setup = setup
        self.peft_model = setup.peft_model
        self.tokenizer = setup.tokenizer
        self.optimizer = setup.optimizer
        self._optimizer = OptimizerParts(setup.optimizer, setup.max_grad_norm)
        self.lr_scheduler = setup.lr_scheduler
        self.max_steps = setup.max_steps
        # On a GPU the job's dropout draws from its own generator, never the device's global one decode samples
        # with. On a CPU it is the global CPU generator, swapped per unit with the data loader's draws (one
        # stream, as in LlamaFactory; decode runs in this same thread there).
        self.generator = torch.default_generator if self.device.type == "cpu" else torch.Generator(self.device)
        compile_thread_counts = ()
        if self.config.compile_layers and self.device.type == "cpu":
            compile_thread_counts = self.config.compile_thread_counts or (torch.get_num_threads(),)
        self.units = DecoderUnits(setup.peft_model, self.device, setup.autocast_dtype, self.generator,
                                  compile_thread_counts)
        for module in self.units.non_layer_modules():
            module.to(self.device)
        self._served_storage_ptrs = set()
        if self.is_shared:
            self._served_storage_ptrs = {t.untyped_storage().data_ptr() for t in served_weights.tensors.values()}
            self._swapper = ServedLayers(self.units.layers, self.device)
        else:
            self._swapper = LayerSwapper(self.units.layers, self.device, weight_memory)

    # ---- the step ----

    def _end_update(self, grad_norm: float | None) -> None:
        """After the optimizer update's last unit: the scheduler's step, and the step is counted."""
        self._log.last["lr"] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._log.last["grad_norm"] = grad_norm
        self.global_step += 1
        self._queue.end_update_step()

    def _rng_states(self) -> dict:
        """The job's RNG states between units (on a CPU its generator is the global one, swapped in per unit)."""
        is_global = self.generator is torch.default_generator
        return {"generator": self._cpu_rng_state if is_global else self.generator.get_state(),
                "cpu": self._cpu_rng_state}

    def _is_save_step(self, step: int) -> bool:
        return bool(self.setup.save_every_steps) and step % self.setup.save_every_steps == 0

    def _finish_step(self) -> bool:
        """End the step; True if it wrote a checkpoint."""
        self._step_boundary_rng_state = self._rng_states()
        self._log.record(self.global_step, float(self._step_loss), self._step_tokens, self._step_ms,
                         self._num_window_layers)
        self._queue.end_step()
        # The last step's checkpoint and the adapter are close()'s, which the caller runs once when finished.
        if not self.is_finished and (self._is_save_step(self.global_step)
                                     or (self.setup.save_each_epoch and self._queue.is_epoch_end)):
            self.save_checkpoint()
            return True
        return False

    def _resume(self) -> dict[str, int]:
        """Load the newest checkpoint; returns its data position."""
        checkpoint = self._store.latest()
        if checkpoint is None:
            raise HarvestError(f"--resume: no harvest checkpoint in output_dir {str(self.llamafactory.output_dir)!r}")
        position, train_state = CheckpointStore.load(checkpoint, self.peft_model)
        self.optimizer.load_state_dict(train_state["optimizer"])
        self.lr_scheduler.load_state_dict(train_state["scheduler"])
        if not isinstance(train_state["rng"], dict):
            raise HarvestError(f"--resume: checkpoint {str(checkpoint)!r} was written by an older harvest "
                               "(global RNG states, not the job's generator); start the job afresh")
        if self.generator is not torch.default_generator:
            self.generator.set_state(train_state["rng"]["generator"])
        self._cpu_rng_state = train_state["rng"]["cpu"]
        self.global_step = position["global_step"]
        return position
