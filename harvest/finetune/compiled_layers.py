"""A decoder layer's call through torch.compile (inductor): its elementwise work fused and its many small ops one
call, which on a CPU finetune partition also holds the interpreter lock far less, beside SGLang's scheduler thread
(eval/README.md, "Compiled layer units").

Graphs are made only while the engine is built (`warm_up`, on one thread): dynamo's tracing is not made for
threads tracing at once, and the job's units run on SGLang's scheduler thread and on the unit thread. A graph
is guarded on the process's global state, two parts of which change between units: the torch thread count (a
partition's cores) and grad mode (forward units run without autograd, recompute with it). So the warm-up
compiles each (thread count, grad mode) the job will run under, on a slice of several rows and one of one row
(SDPA's lowering guards on a batch of 1; unit_warmup.COMPILE_ROW_LENGTHS). After it, units call the layer under dynamo's "eager_on_recompile"
stance: a graph whose guards admit the call runs, else the layer runs eagerly (counted), never traced. The
stance is process-wide: while a unit holds it, a compiled function SGLang calls for the first time runs eagerly
once instead of compiling (it compiles at a later call), and another job's warm-up, which needs the default
stance, waits for the unit (_STANCE) while units wait for no warm-up: they run eagerly meanwhile.

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
"""Dynamo's graph limit per code object (default 8). Every job in the process adds its graphs to the one list of
_call_layer's code, which each call checks in turn; past the limit dynamo would stop compiling it."""

_STANCE = threading.Lock()
"""Held by a unit's call while it sets dynamo's stance, and by a warm-up for all its compiles."""

_eager = threading.local()
"""Per thread: how many layer calls ran eagerly (_call_layer's body runs only then: a graph replaces it)."""


def call_layer(layer: nn.Module, hidden: torch.Tensor, mask, position_ids: torch.Tensor,
               position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """A decoder layer's output hidden states (an HF layer returns them alone or first in a tuple)."""
    output = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings)
    return output[0] if isinstance(output, tuple) else output


def _call_layer(layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """call_layer, the function compiled: its eager runs count themselves."""
    if not torch.compiler.is_compiling():
        _eager.calls = getattr(_eager, "calls", 0) + 1
    return call_layer(layer, hidden, mask, position_ids, position_embeddings)


class CompiledLayers:
    def __init__(self, thread_counts: tuple[int, ...]) -> None:
        """`thread_counts`: the torch thread counts the job's units will run with (its partitions' cores)."""
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, MAX_GRAPHS)
        self.thread_counts = tuple(sorted(set(thread_counts)))
        # fullgraph: a graph break fails the warm-up (the job then runs eagerly, unit_warmup) rather than leave
        # frames of the layer to be traced on whichever thread first runs them. cpp_wrapper: a graph runs as one
        # C++ call that releases the interpreter lock, where inductor's Python wrapper calls each fused kernel
        # with the lock held, keeping a decode thread of the process off its core meanwhile (eval/README.md,
        # "Compiled layer units").
        self._compile = torch.compile(_call_layer, dynamic=True, fullgraph=True, options={"cpp_wrapper": True})
        self._compiling_thread: int | None = None
        self.num_calls = 0
        self.num_eager_calls = 0
        """Calls run eagerly: no graph admitted them (a thread count or state the warm-up did not cover), or
        another job's warm-up was compiling."""

    def warm_up(self, run_units) -> None:
        """Make every graph: `run_units()` runs a layer's units through this object (its forward without
        autograd, its recompute with it and its backward), once per thread count. The compiles run in a thread
        of their own at the lowest priority (about a minute of CPU: decode's threads come first)."""
        failure: list[BaseException] = []

        def compile_all() -> None:
            self._compiling_thread = threading.get_ident()
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICE)
            # A thread's set_num_threads also sets the count later threads start with: put it back.
            before = torch.get_num_threads()
            try:
                for count in self.thread_counts:
                    torch.set_num_threads(count)
                    # Compiled in this thread: no pool of compile processes beside the worker. Floats (the
                    # norms' epsilon, LoRA's scaling) as constants: under dynamic=True dynamo otherwise makes them
                    # graph inputs, checked at every call by Python guards that build a tensor each.
                    with torch._inductor.config.patch(compile_threads=1), \
                            torch._dynamo.config.patch(specialize_float=True):
                        run_units()
            except BaseException as e:  # noqa: BLE001 - raised again in the building thread
                failure.append(e)
            finally:
                torch.set_num_threads(before)
                self._compiling_thread = None

        with _STANCE:
            compiler = threading.Thread(target=compile_all, name="harvest-finetune-compile")
            compiler.start()
            compiler.join()
        if failure:
            raise failure[0]

    def __call__(self, layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                 position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if not torch.is_grad_enabled():
            # Without autograd requires_grad means nothing, but dynamo guards it (layer 0's input has it set by
            # the embedding's hook that gradient checkpointing adds; a later layer's has not).
            hidden = hidden.detach()
        if threading.get_ident() == self._compiling_thread:
            return self._compile(layer, hidden, mask, position_ids, position_embeddings)
        self.num_calls += 1
        eager_before = getattr(_eager, "calls", 0)
        if _STANCE.acquire(blocking=False):
            try:
                with torch.compiler.set_stance("eager_on_recompile"):
                    output = self._compile(layer, hidden, mask, position_ids, position_embeddings)
            finally:
                _STANCE.release()
        else:
            output = _call_layer(layer, hidden, mask, position_ids, position_embeddings)
        self.num_eager_calls += getattr(_eager, "calls", 0) - eager_before
        return output

    def stats(self) -> dict:
        return {"thread_counts": list(self.thread_counts), "calls": self.num_calls, "eager_calls": self.num_eager_calls}


def owned_mask(mask: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """The attention mask as a tensor of its own: HF's (a view) copied, or where HF made none (no row is padded,
    so SDPA's is_causal path would run) the causal mask itself."""
    if mask is not None:
        return mask.clone()
    rows, length = hidden.shape[:2]
    causal = torch.ones(length, length, dtype=torch.bool, device=hidden.device).tril()
    return causal.expand(rows, 1, length, length).clone()
