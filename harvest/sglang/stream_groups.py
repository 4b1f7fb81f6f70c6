"""harvest's green partitions as SGLang's stream groups, so decode's CUDA graphs replay on the stream, and
so the SMs, they were captured on.

A CUDA graph's kernel nodes keep the context of the stream they were captured on: a graph SGLang captured
on a primary-context stream and replayed on a green stream runs on every SM (`harvest doctor` gpu_confine,
`captured_primary`). SGLang 0.5.12 already captures one graph set per stream for its PD multiplexing
(multiplex/pdmux_context.py: STREAM_GROUPS, set_current_stream_idx; CudaGraphRunner.capture and replay keyed
by get_current_stream_idx()). `--enable-pdmux` itself refuses a disaggregation decode worker and the overlap
schedule, so harvest does not turn it on: it fills the stream groups with its partitions' decode streams and
turns on the per-stream capture in the decode worker's CudaGraphRunner only (hooks.py). Group 0 is SGLang's
own (the whole device, every batch size SGLang captures); group k >= 1 is the decode stream of one decode
partition the planner can pick, each step selecting its group before the forward.

A graph set costs memory and capture time per group (SGLang captures every `cuda_graph_bs` on every group,
cuda_graph_runner.py:913-928), so the extra groups are capped twice: at most `max_sets` decode partitions
(the pinned one first, then those the planner co-runs on most), and only batch sizes <= `max_bs` on them
(the largest batch the planner co-runs at; the pinned partition, where every step runs, holds all). A step
on a partition stream with no graph for its batch runs eagerly on that stream (`can_replay`), never through
group 0's graph: that graph's kernels would keep the primary context and run on every SM, over the finetune
partition beside it.

Deferred imports: SGLang is imported when a hook is installed or fires, inside the worker that runs it; importing it
sets up its CUDA and multiprocessing state.
"""

import time

import torch

from harvest.config import DEFAULT_GRAPH_SETS

SGLANG_GROUP = 0


class StreamGroups:
    def __init__(self, partitions, pairs: list[tuple[int, int]], pinned: tuple[int, int] | None = None,
                 max_sets: int = DEFAULT_GRAPH_SETS, max_bs: int | None = None, free_bytes=None):
        """`partitions`: GreenPartitions; `pairs`: the (infer_sms, ft_sms) partitions decode may run on, most
        wanted first; the first `max_sets` distinct decode partitions get a graph set, the `pinned` one before
        all. `max_bs`: the largest batch captured on them (None: every size), but on the pinned one, where
        every step runs. `free_bytes()`: the device's free memory."""
        self.num_sms = partitions.num_sms
        self.max_sets = max_sets
        self.max_bs = max_bs
        self._free_bytes = free_bytes
        self._index: dict[object, int] = {}            # decode stream -> its group
        self.decode_sms = [self.num_sms]                # per group: the SMs decode runs on
        pairs = [*([pinned] if pinned is not None else []), *pairs]
        self.uncaptured_sms = sorted({i for i, _ in pairs if i < self.num_sms})
        for infer_sms in list(dict.fromkeys(i for i, _ in pairs if i < self.num_sms))[:max_sets]:
            decode_stream = partitions.decode_stream(infer_sms, next(f for i, f in pairs if i == infer_sms))
            if decode_stream is None or decode_stream in self._index:
                continue
            self._index[decode_stream] = len(self.decode_sms)
            self.decode_sms.append(infer_sms)
            self.uncaptured_sms.remove(infer_sms)
        self._streams = [None, *self._index]
        is_pinned = pinned is not None and pinned[0] < self.num_sms and max_sets > 0
        self.group_max_bs = [None, *([None] if is_pinned else []), *[max_bs] * (self.num_groups - 1 - is_pinned)]
        self.captured_bs: list[set[int]] = [set() for _ in self.decode_sms]
        self.capture_s = [0.0] * self.num_groups
        self.capture_bytes = [0] * self.num_groups
        self.num_eager_steps = 0
        self._is_eager = False

    @property
    def num_groups(self) -> int:
        return len(self.decode_sms)

    def has_graphs(self, infer_sms: int) -> bool:
        """Decode on infer_sms SMs replays graphs (the whole device always does)."""
        return infer_sms >= self.num_sms or infer_sms in self.decode_sms

    def index_of(self, decode_stream) -> int | None:
        """The group of a step's decode stream (None stream: SGLang's own, group 0); None: no graph set."""
        return SGLANG_GROUP if decode_stream is None else self._index.get(decode_stream)

    def install(self, device) -> None:
        """Hand the groups to SGLang's pdmux context, before the CUDA graph runner captures. Capture reads a
        group's second stream (CudaGraphRunner.capture: graph_capture(stream=sg[1])); group 0 captures on a
        side stream of the primary context, as SGLang does without groups."""
        from sglang.srt.multiplex import pdmux_context

        own = torch.cuda.Stream(device)
        pdmux_context.STREAM_GROUPS = [(own, own), *((stream, stream) for stream in self._streams[1:])]
        pdmux_context.SM_COUNTS = [(self.num_sms - sms, sms) for sms in self.decode_sms]
        pdmux_context.set_current_stream_idx(SGLANG_GROUP)

    def select(self, decode_stream) -> int | None:
        """The step about to launch runs on decode_stream: its graphs are the ones captured on that stream. A
        stream with no set (a partition pinned through the admin API) runs eagerly: None."""
        from sglang.srt.multiplex import pdmux_context

        index = self.index_of(decode_stream)
        self._is_eager = index is None
        pdmux_context.set_current_stream_idx(SGLANG_GROUP if index is None else index)
        return index

    # ---- CudaGraphRunner, through hooks.py ----

    def should_capture(self, stream_idx: int | None, bs: int) -> bool:
        limit = self.group_max_bs[stream_idx or SGLANG_GROUP]
        return limit is None or bs <= limit

    def capture_one(self, capture, bs: int, stream_idx: int | None):
        """capture(): SGLang's capture_one_batch_size for one (group, batch size) of its capture loop, timed
        and its memory counted; (None, None) where the group takes no graph of that size (dropped after the
        loop: `drop_skipped`)."""
        if not self.should_capture(stream_idx, bs):
            return None, None
        group = stream_idx or SGLANG_GROUP
        # The device's free memory, not the graph pool's: the two warm-up forwards SGLang runs before each
        # capture grow torch's cache too (cuda_graph_runner.py:1184), and that is start-up cost as well.
        free_before = self._free_bytes() if self._free_bytes else 0
        started = time.perf_counter()
        result = capture()
        self.capture_s[group] += time.perf_counter() - started
        if self._free_bytes:
            self.capture_bytes[group] += free_before - self._free_bytes()
        self.captured_bs[group].add(bs)
        return result

    @staticmethod
    def drop_skipped(graphs: dict, output_buffers: dict) -> None:
        """SGLang's loop stores whatever capture_one_batch_size returned (cuda_graph_runner.py:903-909)."""
        for key in [key for key, graph in graphs.items() if graph is None]:
            del graphs[key], output_buffers[key]

    def can_replay(self, batch_size: int) -> bool:
        """The selected group holds a graph for this batch, padded as SGLang's replay pads it (bisect over
        capture_bs, cuda_graph_runner.py:1256: the extra groups hold every size <= max_bs, so a batch up to
        the largest of them pads to one they hold). False: the step runs eagerly on its partition's stream."""
        from sglang.srt.multiplex import pdmux_context

        group = pdmux_context.get_current_stream_idx()
        if not self._is_eager and (group == SGLANG_GROUP or (self.captured_bs[group]
                                                              and batch_size <= max(self.captured_bs[group]))):
            return True
        self.num_eager_steps += 1
        return False

    def stats(self) -> dict:
        return {"num_groups": self.num_groups, "decode_sms": self.decode_sms, "max_sets": self.max_sets,
                "max_bs": self.group_max_bs, "uncaptured_decode_sms": self.uncaptured_sms,
                "captured_bs": [sorted(bs) for bs in self.captured_bs],
                "capture_s": [round(s, 3) for s in self.capture_s],
                "capture_mib": [b >> 20 for b in self.capture_bytes],
                "total_capture_s": round(sum(self.capture_s), 3), "total_capture_mib": sum(self.capture_bytes) >> 20,
                "num_eager_steps": self.num_eager_steps}
