"""The units of one row slice (rows of a micro-batch), run one at a time on a decoder-only causal LM laid out like Llama.

embed -> forward(0..L-1) -> head (+ loss, + its backward) -> backward(L-1..0). Forward units run without
autograd and keep only each layer's input; a backward unit recomputes its layer from that input with
autograd on and backpropagates the gradient arriving from above, exactly what gradient checkpointing (on by
default in LlamaFactory) does, but one layer per call so a scheduler can stop between any two layers.
Where units are bounded in time, a layer's backward is two units: recompute (its forward with autograd on,
the graph kept) and backward (the gradient through that graph), so neither carries the whole layer's cost.

Deferred imports: the training libraries (llamafactory, transformers, peft, safetensors) are imported by the functions
that use them, so importing this module does not pay their seconds of start-up.
"""

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from base.errors import HarvestError
from harvest.finetune.compiled_layers import CompiledLayers, call_layer, owned_mask


MIN_VOCAB_CHUNK = 128
"""Fewest vocabulary rows in one chunk of a split head: a chunk is one matrix product, which smaller ones
would spend on launches and bookkeeping."""


@dataclass(slots=True)
class RowSlice:
    """One slice of rows of a micro-batch, with what its units pass to each other."""

    inputs: dict[str, torch.Tensor]
    loss_denominator: torch.Tensor
    """The token count the summed loss is divided by (the Trainer's normalisation over accumulation)."""
    num_tokens: int
    causal_mask: Any = None
    position_ids: torch.Tensor | None = None
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None
    hidden: list[torch.Tensor | None] = field(default_factory=list)
    """hidden[i]: input of decoder layer i; hidden[L]: input of the head."""
    grad: torch.Tensor | None = None
    """Gradient of the loss w.r.t. the input of the next layer to backpropagate through."""
    rng_states: dict[int, Any] = field(default_factory=dict)
    loss: torch.Tensor | None = None
    head_parts: "HeadParts | None" = None
    """What a head split over vocabulary chunks carries from one of its units to the next."""
    recomputed: tuple[int, torch.Tensor, torch.Tensor] | None = None
    """(layer_id, input, output) of a layer recomputed with its graph, for the backward unit after it."""


@dataclass(slots=True)
class HeadParts:
    """A span's head over vocabulary chunks: pass one keeps each chunk's logits and the running log-sum-exp,
    pass two turns them into the gradient of the normed input."""

    hidden: torch.Tensor
    """The span's head input (a leaf that requires grad)."""
    normed: torch.Tensor
    """norm(hidden), with its graph: pass two's last unit backpropagates through it."""
    labels: torch.Tensor
    """The label each position predicts (-100: none)."""
    logits: list[torch.Tensor] = field(default_factory=list)
    max_logit: torch.Tensor | None = None
    sum_exp: torch.Tensor | None = None
    label_logit: torch.Tensor | None = None
    grad_normed: torch.Tensor | None = None


class DecoderUnits:
    def __init__(self, peft_model: nn.Module, device: torch.device, autocast_dtype: torch.dtype | None,
                 generator: torch.Generator, compile_thread_counts: tuple[int, ...] = ()) -> None:
        """`generator`: the job's own RNG on `device`; its dropout draws from it and from nothing else.
        `compile_thread_counts`: run the layers through torch.compile, with graphs for these torch thread
        counts (CompiledLayers); empty, or with dropout (drawn from the job's generator, which dynamo does not
        trace): eagerly."""
        base = peft_model.get_base_model()
        inner = getattr(base, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, name) for name in needed) or not hasattr(base, "lm_head"):
            raise HarvestError(
                f"model_name_or_path: {type(base).__name__} is not laid out like Llama "
                "(model.embed_tokens/layers/norm/rotary_emb + lm_head); harvest's layer-wise engine needs that"
            )
        self.base = base
        self.config = inner.config
        self.embed_tokens = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.rotary_emb = inner.rotary_emb
        self.lm_head = base.lm_head
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.is_embed_trainable = any(p.requires_grad for p in self.embed_tokens.parameters())
        self.generator = generator
        self.uses_dropout = _use_generator_dropout(self.layers, generator)
        self.compiled = None
        self.eager_reason: str | None = None
        """Why layers asked to be compiled run eagerly (dropout, or their warm-up failed to compile them)."""
        if compile_thread_counts and self.uses_dropout:
            self.eager_reason = "LoRA dropout draws from the job's generator, which torch.compile does not trace"
        elif compile_thread_counts:
            self.compiled = CompiledLayers(compile_thread_counts)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @contextmanager
    def drawing_from(self, generator: torch.Generator):
        """Dropout draws from `generator` inside the block, from the job's own generator again after it."""
        own = self.generator
        dropouts = [m for m in self.layers.modules() if isinstance(m, GeneratorDropout)]
        self.generator = generator
        for dropout in dropouts:
            dropout.generator = generator
        try:
            yield
        finally:
            self.generator = own
            for dropout in dropouts:
                dropout.generator = own

    def non_layer_modules(self) -> list[nn.Module]:
        return [self.embed_tokens, self.norm, self.rotary_emb, self.lm_head]

    def embed(self, row_slice: RowSlice) -> None:
        from transformers.masking_utils import create_causal_mask

        input_ids = row_slice.inputs["input_ids"]
        with torch.no_grad(), self._autocast():
            hidden = self.embed_tokens(input_ids)
        # position_ids: [1 or rows, seq_len], as LlamaModel.forward builds them when the batch has none.
        position_ids = row_slice.inputs.get("position_ids")
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        row_slice.position_ids = position_ids
        row_slice.causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=row_slice.inputs.get("attention_mask"),
            past_key_values=None,
            position_ids=position_ids,
        )
        if self.compiled is not None:
            row_slice.causal_mask = owned_mask(row_slice.causal_mask, hidden)
        row_slice.position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        row_slice.hidden = [hidden] + [None] * self.num_layers

    def forward(self, row_slice: RowSlice, layer_id: int) -> None:
        if self.uses_dropout:
            row_slice.rng_states[layer_id] = self.generator.get_state()
        with torch.no_grad(), self._autocast():
            row_slice.hidden[layer_id + 1] = self._run_layer(layer_id, row_slice.hidden[layer_id], row_slice)

    def head(self, row_slice: RowSlice, span: tuple[int, int] | None = None) -> torch.Tensor:
        """Loss of the row slice (already divided by its denominator) and its backward down to the last layer;
        with `span`, of positions [start, end) only: the loss is a sum over positions, so the spans' losses add
        up to the slice's and each fills its positions of the gradient."""
        hidden_all = row_slice.hidden[self.num_layers]
        seq_len = hidden_all.shape[1]
        start, end = span or (0, seq_len)
        hidden = hidden_all[:, start:end].detach().requires_grad_(True)
        labels = row_slice.inputs["labels"]
        with torch.enable_grad(), self._autocast():
            # logits: [rows, end - start, vocab]
            logits = self.lm_head(self.norm(hidden))
            if span is None:
                loss = self.base.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size,
                                               num_items_in_batch=row_slice.loss_denominator)
            else:
                shift_labels = _span_labels(labels, start, end).contiguous()
                loss = self.base.loss_function(logits=logits, labels=None, shift_labels=shift_labels,
                                               vocab_size=self.config.vocab_size,
                                               num_items_in_batch=row_slice.loss_denominator)
        loss.backward()
        self._store_head_grad(row_slice, span, hidden.grad)
        row_slice.loss = loss.detach() if start == 0 else row_slice.loss + loss.detach()
        return loss.detach()

    def _store_head_grad(self, row_slice: RowSlice, span: tuple[int, int] | None, grad: torch.Tensor) -> None:
        """The head's gradient for its span's positions; after the last span the head's input is let go."""
        hidden_all = row_slice.hidden[self.num_layers]
        start, end = span or (0, hidden_all.shape[1])
        if span is None:
            row_slice.grad = grad
        else:
            if start == 0:
                row_slice.grad = torch.empty_like(hidden_all)
            row_slice.grad[:, start:end] = grad
        if end == hidden_all.shape[1]:
            row_slice.hidden[self.num_layers] = None

    @property
    def max_head_vocab_parts(self) -> int:
        """How many vocabulary chunks the head may be split into (head_part), each of at least
        MIN_VOCAB_CHUNK rows; 0: none. It may when the head is a frozen linear layer and the loss is the
        causal LM cross entropy the head's own path uses: the chunks then add up to the same loss and gradient.
        A trained or wrapped lm_head (LoRA, modules_to_save) or another loss keeps whole heads."""
        from transformers.loss.loss_utils import ForCausalLMLoss

        can_split = (type(self.lm_head) is nn.Linear and not any(p.requires_grad for p in self.lm_head.parameters())
                     and getattr(self.base.loss_function, "__func__", self.base.loss_function) is ForCausalLMLoss
                     and getattr(self.config, "final_logit_softcapping", None) is None)
        return self.lm_head.weight.shape[0] // MIN_VOCAB_CHUNK if can_split else 0

    def head_part(self, row_slice: RowSlice, span: tuple[int, int] | None, part: tuple[int, int]) -> torch.Tensor:
        """Unit j of a span's head split over K vocabulary chunks, part = (j, K); returns the loss it adds.
        j < K: chunk j's logits, kept, and the running log-sum-exp over the chunks so far; at j = K - 1 the
        span's loss (as head's). K <= j < 2K: chunk j - K's share of the gradient of the normed input, which
        reads the chunk's weight once more; at j = 2K - 1 its backward through the norm, as head's. The weight
        is read twice in all, as by head's forward and backward, in units of 1/K of it."""
        j, num_parts = part
        hidden_all = row_slice.hidden[self.num_layers]
        seq_len = hidden_all.shape[1]
        start, end = span or (0, seq_len)
        vocab_size = self.lm_head.weight.shape[0]
        bounds = [vocab_size * k // num_parts for k in range(num_parts + 1)]
        k = j % num_parts
        lo, hi = bounds[k], bounds[k + 1]
        weight = self.lm_head.weight[lo:hi]
        bias = None if self.lm_head.bias is None else self.lm_head.bias[lo:hi]
        if j == 0:
            hidden = hidden_all[:, start:end].detach().requires_grad_(True)
            with torch.enable_grad(), self._autocast():
                normed = self.norm(hidden)
            row_slice.head_parts = HeadParts(hidden, normed, _span_labels(row_slice.inputs["labels"], start, end))
        state = row_slice.head_parts
        in_chunk = (state.labels >= lo) & (state.labels < hi)
        if j < num_parts:
            with torch.no_grad(), self._autocast():
                logits = nn.functional.linear(state.normed.detach(), weight, bias)
            logits = logits.float()  # as the loss function upcasts
            state.logits.append(logits)
            chunk_max = logits.amax(dim=-1)
            if state.max_logit is None:
                state.max_logit, state.sum_exp = chunk_max, torch.zeros_like(chunk_max)
                state.label_logit = torch.zeros_like(chunk_max)
            new_max = torch.maximum(state.max_logit, chunk_max)
            state.sum_exp = (state.sum_exp * torch.exp(state.max_logit - new_max)
                             + torch.exp(logits - new_max.unsqueeze(-1)).sum(dim=-1))
            state.max_logit = new_max
            picked = logits.gather(-1, (state.labels - lo).clamp(0, hi - lo - 1).unsqueeze(-1)).squeeze(-1)
            state.label_logit = torch.where(in_chunk, picked, state.label_logit)
            if j < num_parts - 1:
                return torch.zeros((), device=hidden_all.device)
            state.max_logit = state.max_logit + torch.log(state.sum_exp)  # now the log-sum-exp
            valid = state.labels.ne(-100)
            loss = ((state.max_logit - state.label_logit) * valid).sum() / row_slice.loss_denominator
            row_slice.loss = loss if start == 0 else row_slice.loss + loss
            return loss
        # pass two: d loss / d logits = (softmax - one-hot) / denominator on labelled positions
        logits = state.logits[k]
        state.logits[k] = None
        grad_logits = torch.exp(logits - state.max_logit.unsqueeze(-1))
        # -1 at each label in this chunk (a scatter, not an index by nonzero(): no device sync on a GPU)
        grad_logits.scatter_add_(-1, (state.labels - lo).clamp(0, hi - lo - 1).unsqueeze(-1),
                                 -in_chunk.unsqueeze(-1).to(grad_logits.dtype))
        grad_logits *= (state.labels.ne(-100) / row_slice.loss_denominator).unsqueeze(-1)
        with torch.no_grad():
            grad = grad_logits.to(weight.dtype if self.autocast_dtype is None else self.autocast_dtype)
            part_grad = (grad @ weight.to(grad.dtype)).float()
        state.grad_normed = part_grad if state.grad_normed is None else state.grad_normed + part_grad
        if j < 2 * num_parts - 1:
            return torch.zeros((), device=hidden_all.device)
        torch.autograd.backward(state.normed, state.grad_normed.to(state.normed.dtype))
        self._store_head_grad(row_slice, span, state.hidden.grad)
        row_slice.head_parts = None
        return torch.zeros((), device=hidden_all.device)

    def recompute(self, row_slice: RowSlice, layer_id: int) -> None:
        """The first half of backward(layer_id): the layer's forward from its kept input, with autograd on (and
        its dropout masks replayed); the graph waits in the row slice for backward."""
        # Compiled, layer 0 computes its input's gradient too (dropped by backward): one graph for every layer.
        needs_input_grad = layer_id > 0 or self.is_embed_trainable or self.compiled is not None
        hidden = row_slice.hidden[layer_id].detach().requires_grad_(needs_input_grad)
        rng_state = row_slice.rng_states.pop(layer_id, None)
        with _replayed(self.generator, rng_state), torch.enable_grad(), self._autocast():
            output = self._run_layer(layer_id, hidden, row_slice)
        row_slice.recomputed = (layer_id, hidden, output)

    def backward(self, row_slice: RowSlice, layer_id: int) -> None:
        """Backpropagate through the layer, recomputing it first unless a recompute unit just did."""
        if row_slice.recomputed is None or row_slice.recomputed[0] != layer_id:
            self.recompute(row_slice, layer_id)
        _, hidden, output = row_slice.recomputed
        row_slice.recomputed = None
        torch.autograd.backward(output, row_slice.grad)
        row_slice.grad = hidden.grad if layer_id > 0 or self.is_embed_trainable else None
        row_slice.hidden[layer_id] = None
        if layer_id == 0 and self.is_embed_trainable:
            with torch.enable_grad(), self._autocast():
                embedded = self.embed_tokens(row_slice.inputs["input_ids"])
            torch.autograd.backward(embedded, row_slice.grad)
            row_slice.grad = None

    def _run_layer(self, layer_id: int, hidden: torch.Tensor, row_slice: RowSlice) -> torch.Tensor:
        run = call_layer if self.compiled is None else self.compiled
        return run(self.layers[layer_id], hidden, row_slice.causal_mask, row_slice.position_ids,
                   row_slice.position_embeddings)

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)


def _span_labels(labels: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The label each position of [start, end) predicts: the next position's (what the loss function's own
    shift does), -100 after the last."""
    return nn.functional.pad(labels, (0, 1), value=-100)[:, start + 1:end + 1]


class GeneratorDropout(nn.Module):
    """nn.Dropout whose masks come from the job's own generator. torch's dropout draws from the device's
    global generator, which decode's sampling also draws from (from another thread in spatial mode): the job
    must neither advance it nor swap its state."""

    def __init__(self, p: float, generator: torch.Generator) -> None:
        super().__init__()
        self.p, self.generator = p, generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        # torch's own CPU dropout, op for op (at::native _dropout_impl): the same masks from the same state.
        noise = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=self.generator)
        noise.div_(1.0 - self.p)
        return x * noise


def _use_generator_dropout(layers: nn.Module, generator: torch.Generator) -> bool:
    """Swap every nn.Dropout with p > 0 in the layers (LoRA's lora_dropout) for GeneratorDropout; True if any."""
    swapped = False
    for parent in layers.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Dropout) and child.p > 0:
                replacement = GeneratorDropout(child.p, generator)
                replacement.train(child.training)
                setattr(parent, name, replacement)
                swapped = True
    return swapped


def global_rng_state(device: torch.device) -> torch.Tensor:
    """The device's global generator state (seeded by LlamaFactory's set_seed): where the job's own starts."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


@contextmanager
def _replayed(generator: torch.Generator, state: torch.Tensor | None):
    """Replay the draws a forward unit made (dropout masks) during the backward recompute, then go on from
    where the generator was."""
    if state is None:
        yield
        return
    current = generator.get_state()
    generator.set_state(state)
    try:
        yield
    finally:
        generator.set_state(current)
