"""harvest's green partitions as SGLang's stream groups, so decode's CUDA graphs replay on the stream, and
so the SMs, they were captured on.

A CUDA graph's kernel nodes keep the context of the stream they were captured on: a graph SGLang captured
on a primary-context stream and replayed on a green stream runs on every SM (`harvest doctor` gpu_confine,
`captured_primary`). SGLang 0.5.12 already captures one graph set per stream for its PD multiplexing
(multiplex/pdmux_context.py: STREAM_GROUPS, set_current_stream_idx; CudaGraphRunner.capture and replay keyed
by get_current_stream_idx()). `--enable-pdmux` itself refuses a disaggregation decode worker and the overlap
schedule, so harvest does not turn it on: it fills the stream groups with its partitions' decode streams and
turns on the per-stream capture in the decode worker's CudaGraphRunner only (hooks.py). Group 0 is SGLang's
own (the whole device); group k >= 1 is the decode stream of one decode partition the planner can pick, and
each step selects its group before the forward. Graph memory grows with the number of groups (one graph set
per group), so only the partitions the planner can pick get one.
"""

SGLANG_GROUP = 0


class StreamGroups:
    def __init__(self, partitions, pairs: list[tuple[int, int]]):
        """`partitions`: GreenPartitions; `pairs`: the (infer_sms, ft_sms) partitions the planner may pick."""
        self.num_sms = partitions.num_sms
        self._index: dict[object, int] = {}            # decode stream -> its group
        self.decode_sms = [self.num_sms]                # per group: the SMs decode runs on
        for infer_sms, ft_sms in sorted(pairs):
            decode_stream = partitions.decode_stream(infer_sms, ft_sms)
            if decode_stream is None or decode_stream in self._index:
                continue
            self._index[decode_stream] = len(self.decode_sms)
            self.decode_sms.append(infer_sms)
        self._streams = [None, *self._index]

    @property
    def num_groups(self) -> int:
        return len(self.decode_sms)

    def index_of(self, decode_stream) -> int:
        """The group of a step's decode stream (None: SGLang's own streams, the whole device)."""
        return SGLANG_GROUP if decode_stream is None else self._index[decode_stream]

    def install(self, device) -> None:
        """Hand the groups to SGLang's pdmux context, before the CUDA graph runner captures. Capture reads a
        group's second stream (CudaGraphRunner.capture: graph_capture(stream=sg[1])); group 0 captures on a
        side stream of the primary context, as SGLang does without groups."""
        import torch
        from sglang.srt.multiplex import pdmux_context

        own = torch.cuda.Stream(device)
        pdmux_context.STREAM_GROUPS = [(own, own), *((stream, stream) for stream in self._streams[1:])]
        pdmux_context.SM_COUNTS = [(self.num_sms - sms, sms) for sms in self.decode_sms]
        pdmux_context.set_current_stream_idx(SGLANG_GROUP)

    def select(self, decode_stream) -> int:
        """The step about to launch runs on decode_stream: its graph is the one captured on that stream."""
        from sglang.srt.multiplex import pdmux_context

        index = self.index_of(decode_stream)
        pdmux_context.set_current_stream_idx(index)
        return index

    def stats(self) -> dict:
        return {"num_groups": self.num_groups, "decode_sms": self.decode_sms}
