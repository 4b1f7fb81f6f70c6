"""StepQueue: the units of the current optimizer step, in order, over the HF Trainer's own data order.

A step takes the next gradient-accumulation window of micro-batches from the Trainer's dataloader, splits
each into row slices (UnitSizer: so one unit stays under its time bound) and queues, per row slice,
embed -> forward per layer -> head (one unit, or one per span of positions, each split over vocabulary chunks
where one span's head alone is over the bound) -> backward per layer (reversed; where units have a time
bound, each is a recompute unit and a backward unit), then the optimizer update: one unit, or where units have
a time bound and the optimizer allows it, a grad_norm unit and the update's parts (OptimizerParts).
"""

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harvest.finetune.decoder_units import RowSlice
from harvest.finetune.optimizer_parts import OptimizerParts
from harvest.finetune.training_setup import TrainingSetup
from harvest.finetune.unit_sizer import UnitSizer

IGNORE_INDEX = -100
UPDATE_KINDS = ("grad_norm", "optimizer")
"""The optimizer update's unit kinds: no tokens, no layer, no window change."""


@dataclass(frozen=True, slots=True)
class Unit:
    kind: str
    layer_id: int | None
    slice_id: int
    span: tuple[int, int] | None = None
    """A head unit's sequence positions [start, end); None: the whole sequence."""
    vocab_part: tuple[int, int] | None = None
    """(j, K): unit j of 2K of a head split over K vocabulary chunks (DecoderUnits.head_part); None: whole."""
    param_part: tuple[int, int] | None = None
    """(j, P): an optimizer unit that is part j of an update cut into P (OptimizerParts); None: the whole."""

    @property
    def is_step_end(self) -> bool:
        """The optimizer update's last unit: the step is done after it."""
        return self.kind == "optimizer" and (self.param_part is None or self.param_part[0] == self.param_part[1] - 1)


class StepQueue:
    def __init__(self, setup: TrainingSetup, sizer: UnitSizer, device: torch.device, num_layers: int,
                 optimizer: OptimizerParts, max_head_vocab_parts: int = 0):
        self._setup, self._sizer, self._device, self._num_layers = setup, sizer, device, num_layers
        self._optimizer = optimizer
        self._max_head_vocab_parts = max_head_vocab_parts
        self._units: deque[Unit] = deque()
        self.slices: list[RowSlice] = []
        self.epoch, self.update_step = 0, 0

    def start(self, epoch: int, update_step: int) -> None:
        """Position the data at (epoch, update_step): 0, 0 for a new job, a checkpoint's for a resumed one."""
        if update_step == self._setup.num_update_steps_per_epoch:
            epoch, update_step = epoch + 1, 0
        self.epoch, self.update_step = epoch, update_step
        self._open_epoch(epoch, update_step * self._setup.num_grad_accum_steps)

    def peek(self) -> Unit | None:
        """The next unit of the step in progress; None between steps (the next one starts with "embed")."""
        return self._units[0] if self._units else None

    def pop(self) -> Unit:
        """The next unit, starting a new step (its batches read, split and queued) when none is in progress."""
        if not self._units:
            self._begin_step()
        return self._units.popleft()

    @property
    def num_step_tokens(self) -> int:
        return sum(row_slice.num_tokens for row_slice in self.slices)

    def num_unit_tokens(self, unit: Unit) -> int:
        """Non-padding tokens the unit processes (0 for the optimizer update's units)."""
        if unit.kind in UPDATE_KINDS:
            return 0
        row_slice = self.slices[unit.slice_id]
        if unit.span is None:
            return row_slice.num_tokens
        start, end = unit.span
        mask = row_slice.inputs.get("attention_mask")
        if mask is not None and mask.dim() == 2:
            return int(mask[:, start:end].sum())
        return self.num_unit_positions(unit)  # no padding mask: every position is a token

    def num_unit_positions(self, unit: Unit) -> int:
        """Positions the unit computes, padding included (0 for the optimizer update's units): its size to the
        UnitSizer, as cost follows positions, not the tokens among them."""
        if unit.kind in UPDATE_KINDS:
            return 0
        num_rows, seq_len = self.slices[unit.slice_id].inputs["input_ids"].shape
        return num_rows * (seq_len if unit.span is None else unit.span[1] - unit.span[0])

    def upcoming_layer_ids(self) -> Iterator[int]:
        """The layers the units left in the step touch, in order: read lazily, the window needs only its first few."""
        return (unit.layer_id for unit in self._units if unit.layer_id is not None)

    def end_update_step(self) -> None:
        self.update_step += 1

    @property
    def is_epoch_end(self) -> bool:
        return self.update_step == self._setup.num_update_steps_per_epoch

    def end_step(self) -> None:
        self.slices = []

    def _open_epoch(self, epoch: int, num_skip_batches: int) -> None:
        if hasattr(self._setup.dataloader, "set_epoch"):
            self._setup.dataloader.set_epoch(epoch)
        self._epoch_iter = iter(self._setup.dataloader)
        for _ in range(num_skip_batches):
            next(self._epoch_iter)

    def _begin_step(self) -> None:
        setup = self._setup
        if self.update_step == setup.num_update_steps_per_epoch:
            self.epoch, self.update_step = self.epoch + 1, 0
            self._open_epoch(self.epoch, 0)
        # As the Trainer's epoch loop: the last update step of an epoch takes what is left of it.
        remainder = setup.num_batches_per_epoch % setup.num_grad_accum_steps or setup.num_grad_accum_steps
        is_last_of_epoch = self.update_step == setup.num_update_steps_per_epoch - 1
        num_batches = remainder if is_last_of_epoch else setup.num_grad_accum_steps
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(self._epoch_iter))
            except StopIteration:
                break
        # The HF Trainer's normalisation: with loss kwargs, token sum / labelled tokens of the whole
        # accumulation window; without, each micro-batch's mean / micro-batches in the window.
        num_items = sum(batch["labels"].ne(IGNORE_INDEX).sum() for batch in batches)
        self.slices = []
        for batch in batches:
            batch = {k: v.to(self._device) if torch.is_tensor(v) else v for k, v in batch.items()}
            if setup.model_accepts_loss_kwargs:
                denominator = num_items
            else:
                denominator = batch["labels"][:, 1:].ne(IGNORE_INDEX).sum() * len(batches)
            self.slices.extend(self._split(batch, torch.as_tensor(denominator, device=self._device)))
        backward_kinds = ("recompute", "backward") if self._sizer.max_unit_ms is not None else ("backward",)
        for slice_id in range(len(self.slices)):
            self._units.append(Unit("embed", None, slice_id))
            self._units.extend(Unit("forward", i, slice_id) for i in range(self._num_layers))
            num_rows, seq_len = self.slices[slice_id].inputs["input_ids"].shape
            spans = self._sizer.head_spans(num_rows, seq_len)
            for span in spans:
                parts = self._sizer.head_vocab_parts(num_rows * (span[1] - span[0]), self._max_head_vocab_parts)
                span_or_whole = None if len(spans) == 1 else span
                if parts:
                    self._units.extend(Unit("head", None, slice_id, span_or_whole, (j, parts)) for j in range(2 * parts))
                else:
                    self._units.append(Unit("head", None, slice_id, span_or_whole))
            self._units.extend(Unit(kind, i, slice_id) for i in reversed(range(self._num_layers))
                               for kind in backward_kinds)
        self._queue_update(len(self.slices) - 1)

    def _queue_update(self, slice_id: int) -> None:
        if self._sizer.max_unit_ms is None or not self._optimizer.is_splittable:
            self._units.append(Unit("optimizer", None, slice_id))
            return
        if self._optimizer.is_clipping:
            self._units.append(Unit("grad_norm", None, slice_id))
        # Untimed, the first update is cut as finely as one part per layer's worth of parameters.
        num_parts = self._sizer.optimizer_parts(min(self._optimizer.num_tensors, self._num_layers))
        self._units.extend(Unit("optimizer", None, slice_id, param_part=(j, num_parts)) for j in range(num_parts))

    def _split(self, batch: dict[str, Any], denominator: torch.Tensor) -> list[RowSlice]:
        inputs = {k: v for k, v in batch.items() if torch.is_tensor(v)}
        num_rows, seq_len = inputs["input_ids"].shape
        rows = self._sizer.rows_per_slice(num_rows, seq_len)
        row_slices = []
        for start in range(0, num_rows, rows):
            # every tensor of the batch: [num_rows, ...] sliced to [rows, ...]; others (shared) kept whole
            part = {k: (v[start : start + rows] if v.shape[0] == num_rows else v) for k, v in inputs.items()}
            mask = part.get("attention_mask")
            num_tokens = int(mask.sum()) if mask is not None and mask.dim() == 2 else part["input_ids"].numel()
            row_slices.append(RowSlice(part, denominator, num_tokens))
        return row_slices
