"""The first run of every unit kind, done while the engine is built, so that a kind's first unit on the decode
path is not the one that loads its kernels.

A process's first run of a kind pays one-time work (on a GPU: CUDA's lazy module loading, cuBLAS handles and
workspaces, autograd's first use; on a CPU: thread pools, allocator arenas), many times the kind's later
runs (eval/results/2026-11-27-warmup/README.md). Here each kind runs once, through the same DecoderUnits and
OptimizerParts calls, on a tiny batch made by the job's own collator and on the last decoder layer only (every
layer runs the same kernels; the last one's backward also computes its input's gradient, as the step's first
backward does).

It changes nothing training reads: dropout draws from a throwaway generator (never the job's, nor the device's
global one, which decode samples from while the engine is built), the gradients it leaves are dropped, the
optimizer update is a throwaway copy's (OptimizerParts.throwaway_copy), and the data loader, the step's queue,
the unit sizer and the step count are not touched.
"""

import time
from contextlib import contextmanager, nullcontext

import torch

from harvest.finetune.decoder_units import DecoderUnits, RowSlice
from harvest.finetune.optimizer_parts import OptimizerParts
from harvest.finetune.step_queue import IGNORE_INDEX

ROW_LENGTHS = (16, 9)
"""Two rows of unequal length: the batch is padded, so the attention mask is built as for a real one."""

COMPILE_ROW_LENGTHS = (17, 13, 11, 7, 5)
"""The compile warm-up's slice: sizes (5 rows, 17 positions) that equal no dimension of a model's (heads, KV heads,
head size), where dynamo would take the size for that constant and make the graph for it alone."""


def warm_up_units(units: DecoderUnits, layers, optimizer: OptimizerParts, collate,
                  can_split_head: bool) -> dict[str, float]:
    """Run every unit kind once; returns each kind's time in ms. `layers`: the engine's LayerSwapper or
    ServedLayers (its `borrowed` layer); `collate`: the Trainer's collator; `can_split_head`: also the head
    over vocabulary chunks (DecoderUnits.head_part), which a bounded job may cut it into."""
    device = units.device
    times: dict[str, float] = {}

    @contextmanager
    def timed(kind: str):
        started = time.perf_counter()
        yield
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        times[kind] = times.get(kind, 0.0) + (time.perf_counter() - started) * 1e3

    params = [p for p in units.base.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    layer_id = units.num_layers - 1
    row_slice = _tiny_row_slice(collate, device)
    # On a GPU its own stream: the build thread's default stream would order it with nothing of decode's.
    on_stream = torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else nullcontext()
    try:
        with on_stream, units.drawing_from(torch.Generator(device)), layers.borrowed(layer_id):
            if units.compiled is not None:
                with timed("compile"):
                    try:
                        units.compiled.warm_up(lambda: _run_layer_units(units, collate, layer_id))
                    except Exception as e:  # noqa: BLE001 - a model dynamo cannot trace whole trains eagerly
                        units.compiled = None
                        units.eager_reason = f"compiling them failed: {type(e).__name__}: {str(e).splitlines()[0]}"
            with timed("embed"):
                units.embed(row_slice)
            # hidden[i]: input of layer i; the last layer runs on the embedding's output.
            row_slice.hidden[layer_id] = row_slice.hidden[0]
            with timed("forward"):
                units.forward(row_slice, layer_id)
            if can_split_head:
                head_input = row_slice.hidden[units.num_layers]
                with timed("head"):
                    for j in range(4):
                        units.head_part(row_slice, None, (j, 2))
                row_slice.hidden[units.num_layers] = head_input  # the last part let it go
            with timed("head"):
                units.head(row_slice)
            with timed("recompute"):
                units.recompute(row_slice, layer_id)
            with timed("backward"):
                units.backward(row_slice, layer_id)
            throwaway = optimizer.throwaway_copy()
            if throwaway is not None:
                if throwaway.is_clipping:
                    with timed("grad_norm"):
                        throwaway.take_grad_norm()
                with timed("optimizer"):
                    throwaway.step_part(0, 1)
    finally:
        for param, grad in zip(params, grads):
            param.grad = grad
    return times


def _run_layer_units(units: DecoderUnits, collate, layer_id: int) -> None:
    """A layer's forward, recompute and backward, the gradient from above all ones, on several rows and on one (a
    one-row slice has graphs of its own: SDPA's lowering guards on a batch of 1)."""
    for lengths in (COMPILE_ROW_LENGTHS, COMPILE_ROW_LENGTHS[:1]):
        row_slice = _tiny_row_slice(collate, units.device, lengths)
        units.embed(row_slice)
        row_slice.hidden[layer_id] = row_slice.hidden[0]
        units.forward(row_slice, layer_id)
        row_slice.grad = torch.ones_like(row_slice.hidden[layer_id + 1])
        units.recompute(row_slice, layer_id)
        units.backward(row_slice, layer_id)


def _tiny_row_slice(collate, device: torch.device, lengths: tuple[int, ...] = ROW_LENGTHS) -> RowSlice:
    """Rows of token ids 1..n, their first two positions unlabelled (as a prompt is), padded by the collator."""
    features = []
    for length in lengths:
        ids = list(range(1, length + 1))
        features.append({"input_ids": ids, "attention_mask": [1] * length, "labels": [IGNORE_INDEX] * 2 + ids[2:]})
    inputs = {k: v.to(device) for k, v in collate(features).items() if torch.is_tensor(v)}
    return RowSlice(inputs, inputs["labels"].ne(IGNORE_INDEX).sum(), inputs["input_ids"].numel())
