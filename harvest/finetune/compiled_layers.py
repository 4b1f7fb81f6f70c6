"""A decoder layer's call through torch.compile (inductor): its elementwise work fused and its many small ops one
call, which on a CPU finetune partition also holds the interpreter lock far less, beside SGLang's scheduler thread.

Graphs are made only while the engine is built (`warm_up`, on the build thread): dynamo's tracing is not made
for threads tracing at once, and the job's units run on SGLang's scheduler thread and on the unit thread. A
graph is guarded on the process's global state, two parts of which change between units: the torch thread
count (a partition's cores) and grad mode (forward units run without autograd, recompute with it). So the
warm-up compiles each (thread count, grad mode) the job will run under, on a slice of two rows and one of one
row (SDPA's lowering guards on a batch of 1), and after it a call that no graph's guards admit runs eagerly,
counted, instead of tracing.

Sizes are dynamic: the graphs serve every layer, row count and length. The attention mask is always a tensor
the slice owns (HF makes None when no row is padded, else a view of a larger tensor, whose base dynamo guards),
and a recomputed layer's input always requires its gradient, so neither sends a unit to the eager path.
"""

import os
import threading

import torch
from torch import nn

COMPILE_NICE = 19
"""The compiling thread's nice value: the lowest priority (its child compiler processes inherit it)."""

MAX_GRAPHS = 64
"""Dynamo's per-function graph limit (default 8): every job in the process adds its own graphs to the one
compiled function; past the limit dynamo would run it eagerly."""


def _call_layer(layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    output = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings)
    return output[0] if isinstance(output, tuple) else output


class CompiledLayers:
    def __init__(self, thread_counts: tuple[int, ...]) -> None:
        """`thread_counts`: the torch thread counts the job's units will run with (its partitions' cores)."""
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, MAX_GRAPHS)
        self.thread_counts = tuple(sorted(set(thread_counts)))
        self._compiled = torch.compile(_call_layer, dynamic=True)
        self.num_eager_calls = 0
        """Calls that no graph admitted (a thread count or state the warm-up did not cover), run eagerly."""
        self.first_eager_reason: str | None = None
        """The guard failures of the first such call, as dynamo words them."""
        self._is_warming_up = False

    def warm_up(self, run_units) -> None:
        """Make every graph: `run_units()` runs a layer's units through this object (its forward without
        autograd, its recompute with it and its backward), once per thread count. The compiles run in a thread
        of their own at the lowest priority (about a minute of CPU: decode's threads come first), one at a time."""
        failure: list[BaseException] = []

        def compile_all() -> None:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICE)
            try:
                for count in self.thread_counts:
                    torch.set_num_threads(count)
                    # Compiled in this thread: no pool of compile processes beside the worker.
                    with torch._inductor.config.patch(compile_threads=1):
                        run_units()
            except BaseException as e:  # noqa: BLE001 - raised again in the building thread
                failure.append(e)

        self._is_warming_up = True
        try:
            compiler = threading.Thread(target=compile_all, name="harvest-finetune-compile")
            compiler.start()
            compiler.join()
        finally:
            self._is_warming_up = False
        if failure:
            raise failure[0]

    def __call__(self, layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                 position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if not torch.is_grad_enabled():
            # Without autograd requires_grad means nothing, but dynamo guards it (layer 0's input has it set by
            # the embedding's hook that gradient checkpointing adds; a later layer's has not).
            hidden = hidden.detach()
        if self._is_warming_up:
            return self._compiled(layer, hidden, mask, position_ids, position_embeddings)
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self._compiled(layer, hidden, mask, position_ids, position_embeddings)
        except RuntimeError as e:  # dynamo's own error type for it is a plain RuntimeError
            if "fail_on_recompile" not in str(e):
                raise
            if self.first_eager_reason is None:
                self.first_eager_reason = str(e).split("\n", 1)[-1].strip()
        self.num_eager_calls += 1
        return _call_layer(layer, hidden, mask, position_ids, position_embeddings)

    def stats(self) -> dict:
        return {"thread_counts": list(self.thread_counts), "eager_calls": self.num_eager_calls,
                "first_eager_reason": self.first_eager_reason}


def owned_mask(mask: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """The attention mask as a tensor of its own: HF's (a view) copied, or where HF made none (no row is padded,
    so SDPA's is_causal path would run) the causal mask itself."""
    if mask is not None:
        return mask.clone()
    rows, length = hidden.shape[:2]
    causal = torch.ones(length, length, dtype=torch.bool, device=hidden.device).tril()
    return causal.expand(rows, 1, length, length).clone()
