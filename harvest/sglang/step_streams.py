"""One decode step on its partition's stream, handed to and back from SGLang's streams.

Without the overlap schedule SGLang writes a step's inputs on the scheduler's current stream (its schedule
stream) and reads the outputs back there (`next_token_ids.tolist()`). The step's kernels run on the
partition's decode stream in between, so the decode stream waits on the schedule stream before the forward
and the schedule stream waits on the decode stream before anything reads the outputs; tensors crossing
streams get record_stream, so torch's caching allocator does not hand their memory to another stream's
allocation while the other stream may still use it. Without that, decode reads half-written inputs and
SGLang reads tokens not yet written: wrong tokens, silently (`harvest doctor` gpu_handoff shows the race).

With the overlap schedule SGLang does the hand-off itself: run_batch enters its forward_stream after
`forward_stream.wait_stream(schedule_stream)` and outputs are read after a copy_done event recorded on it.
There the partition's decode stream becomes the scheduler's forward_stream for the step (else run_batch would
launch on SGLang's own forward stream, on every SM); a new forward stream first waits on the previous one,
because step n+1 reads the future map step n wrote there.
"""

import torch

from harvest.sglang.stream_groups import StreamGroups


class StepStreams:
    def __init__(self, scheduler, groups: StreamGroups | None = None, on_forward_stream=None):
        """`groups`: the stream groups the decode graphs were captured per (None: no per-stream graphs).
        `on_forward_stream(stream)`: called with every stream a forward runs on (it touches the KV buffers)."""
        self._scheduler = scheduler
        self._groups = groups
        self._on_forward_stream = on_forward_stream or (lambda stream: None)
        self.is_overlap = bool(scheduler.enable_overlap)
        self._sglang_forward_stream = scheduler.forward_stream if self.is_overlap else None
        if self._sglang_forward_stream is not None:
            self._on_forward_stream(self._sglang_forward_stream)

    def run(self, forward, decode_stream, batch):
        """forward(): SGLang's run_batch for `batch`; decode_stream: the partition's, None for SGLang's own."""
        if self._groups is not None:
            self._groups.select(decode_stream)
        if self.is_overlap:
            self._make_forward_stream(self._sglang_forward_stream if decode_stream is None else decode_stream)
            return forward()
        if decode_stream is None:
            return forward()
        self._on_forward_stream(decode_stream)
        schedule_stream = torch.cuda.current_stream()
        decode_stream.wait_stream(schedule_stream)
        for tensor in device_tensors(batch, batch.sampling_info):
            tensor.record_stream(decode_stream)
        with torch.cuda.stream(decode_stream):
            result = forward()
        schedule_stream.wait_stream(decode_stream)
        for tensor in device_tensors(result, getattr(result, "logits_output", None)):
            tensor.record_stream(schedule_stream)
        return result

    def _make_forward_stream(self, stream) -> None:
        scheduler = self._scheduler
        if stream is scheduler.forward_stream:
            return
        stream.wait_stream(scheduler.forward_stream)
        self._on_forward_stream(stream)
        scheduler.forward_stream = stream
        scheduler.forward_stream_ctx = torch.cuda.stream(stream)


def device_tensors(*holders):
    """The device tensors held directly in these objects' attributes (a step's inputs or outputs)."""
    for holder in holders:
        for value in getattr(holder, "__dict__", {}).values():
            if getattr(value, "is_cuda", False) is True and hasattr(value, "record_stream"):
                yield value
