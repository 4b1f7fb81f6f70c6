"""SM partitions of one GPU as stream pairs on disjoint green contexts (CUDA >= 12.4).

One `cuDevSmResourceSplitByCount` cuts the device into groups of at least the partition granularity (the
driver's `minSmPartitionSize`, aligned to `smCoscheduledAlignment`: 8 SMs on an H100). The driver decides
how many groups and how large: one H100 gives 16 groups of 8 + 4 SMs left over, another 15 + 12. A
partition is a run of consecutive groups, decode taking a prefix whose SMs add up to `infer_sms` and
finetune the groups right after it adding up to `ft_sms`; both come from the same split, so they are
disjoint. A requested pair no run of groups forms is dropped with a warning (`dropped_pairs`); the planner
may pick only `pairs`. A green context is created the first time one of its pairs is asked for, or up
front with `prepare`, so a 136-pair grid does not create 136 contexts at start-up. Without requested pairs
(a worker pinned for profiling, no profile yet) the partitions are every one the split forms on the device's
grid (`grid`): the profiler may pin any of them.

Deferred imports: torch and the CUDA bindings only when green contexts are made on a GPU.
"""

import contextlib
import logging
from itertools import accumulate

from predictor.partition_grid import PartitionGrid

logger = logging.getLogger(__name__)


def _check(result):
    """cuda.bindings returns (CUresult, *values): raise on error, return the values."""
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver call failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else values


def group_runs(group_sms: list[int], infer_sms: int, ft_sms: int) -> tuple[range, range] | None:
    """Group indices for decode (a prefix) and finetune (the run right after it) whose SM counts add up to
    infer_sms and ft_sms; None when no such runs exist. Pure arithmetic over the driver's group sizes."""
    ends = [0, *accumulate(group_sms)]                  # ends[k]: SMs in groups [0, k)
    if infer_sms not in ends or ends.index(infer_sms) == 0:
        return None
    first = ends.index(infer_sms)
    if ft_sms == 0:
        return range(first), range(first, first)
    if infer_sms + ft_sms not in ends:
        return None
    return range(first), range(first, ends.index(infer_sms + ft_sms))


class GreenPartitions:
    def __init__(self, device_index: int, pairs: list[tuple[int, int]] | None):
        """`pairs`: the (infer_sms, ft_sms) partitions wanted (a profile's); None: every one the device forms."""
        import torch
        from cuda.bindings import driver


        _check(driver.cuInit(0))
        self._device = _check(driver.cuDeviceGet(device_index))
        name = _check(driver.cuDeviceGetName(256, self._device))
        self.device_name = (name.decode() if isinstance(name, bytes) else str(name)).split("\x00", 1)[0]
        self._torch_device = torch.device("cuda", device_index)
        resource = _check(driver.cuDeviceGetDevResource(self._device, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
        self.num_sms = resource.sm.smCount
        self.granularity = max(resource.sm.minSmPartitionSize, resource.sm.smCoscheduledAlignment, 1)
        groups, num_groups, remaining = _check(
            driver.cuDevSmResourceSplitByCount(self.num_sms // self.granularity, resource, 0, self.granularity))
        self._groups = list(groups)[:num_groups]
        self.group_sms = [group.sm.smCount for group in self._groups]
        self.remaining_sms = remaining.sm.smCount
        self.grid = PartitionGrid(self.num_sms, self.granularity)
        is_requested = pairs is not None
        if pairs is None:
            pairs = [*((i, 0) for i in self.grid.infer_options()), *self.grid.pairs()]
        self._runs: dict[tuple[int, int], tuple[range, range] | None] = {}
        self.dropped_pairs: list[tuple[int, int]] = []
        for infer_sms, ft_sms in pairs:
            runs = None if infer_sms >= self.num_sms else group_runs(self.group_sms, infer_sms, ft_sms)
            if runs is None and not (infer_sms >= self.num_sms and ft_sms == 0):
                self.dropped_pairs.append((infer_sms, ft_sms))
                continue
            self._runs[(infer_sms, ft_sms)] = runs
        self._streams: dict[tuple[int, int], object] = {}   # (first group, end group) -> stream
        if self.dropped_pairs and is_requested:
            logger.warning("harvest: the driver split %d SMs into groups %s + %d left over; %d of %d partitions "
                           "cannot be formed and are dropped: %s", self.num_sms, self.group_sms, self.remaining_sms,
                           len(self.dropped_pairs), len(pairs), self.dropped_pairs[:8])
        logger.info("harvest: %d SM partitions on %d SMs, groups %s", len(self._runs), self.num_sms, self.group_sms)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The (infer_sms, ft_sms) partitions this device forms: the only ones the planner may pick."""
        return list(self._runs)

    @property
    def num_contexts(self) -> int:
        return len(self._streams)

    def prepare(self, pairs: list[tuple[int, int]]) -> None:
        """Create the green contexts of these partitions now (start-up), not at their first step."""
        for infer_sms, ft_sms in pairs:
            self.streams(infer_sms, ft_sms)

    def streams(self, infer_sms: int, ft_sms: int):
        """(decode stream, finetune stream or None) of a partition in `pairs`. The whole device, decode
        alone, is (None, None): decode stays on SGLang's own streams (stream_groups.py, group 0)."""
        return self.decode_stream(infer_sms, ft_sms), self._finetune_stream(infer_sms, ft_sms)

    def _group_runs(self, infer_sms: int, ft_sms: int) -> tuple[range, range] | None:
        if (infer_sms, ft_sms) not in self._runs:
            raise KeyError(f"partition ({infer_sms}, {ft_sms}) is not formed on this device; pick one of `pairs`")
        return self._runs[(infer_sms, ft_sms)]

    def _finetune_stream(self, infer_sms: int, ft_sms: int):
        runs = self._group_runs(infer_sms, ft_sms)
        return None if runs is None or not ft_sms else self._stream_for(runs[1])

    # The partition interface SpatialController uses (CorePartitions is the CPU form): a context per thread.

    def can_form(self, infer_sms: int, ft_sms: int) -> bool:
        return (infer_sms, ft_sms) in self._runs

    def decode_context(self, infer_sms: int, ft_sms: int):
        """Nothing for the scheduler thread itself: decode moves by its stream (decode_stream), which
        harvest/sglang/step_streams.py switches to with the hand-offs SGLang's streams need."""
        return contextlib.nullcontext()

    def decode_stream(self, infer_sms: int, ft_sms: int):
        """The partition's decode stream alone (its finetune context is not created: stream_groups.py makes
        decode graphs for every formed partition of a profiling worker, ~136 finetune runs on an H100)."""
        runs = self._group_runs(infer_sms, ft_sms)
        return None if runs is None else self._stream_for(runs[0])

    def finetune_context(self, infer_sms: int, ft_sms: int):
        import torch

        return torch.cuda.stream(self._finetune_stream(infer_sms, ft_sms))

    def whole_device_context(self):
        import torch

        return torch.cuda.stream(torch.cuda.default_stream(self._torch_device))

    def _stream_for(self, group_ids: range):
        key = (group_ids.start, group_ids.stop)
        if key not in self._streams:
            import torch
            from cuda.bindings import driver

            chosen = self._groups[group_ids.start:group_ids.stop]
            desc = _check(driver.cuDevResourceGenerateDesc(chosen, len(chosen)))
            green_ctx = _check(driver.cuGreenCtxCreate(desc, self._device,
                                                       driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
            stream = _check(driver.cuGreenCtxStreamCreate(green_ctx, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
            self._streams[key] = torch.cuda.ExternalStream(int(stream), device=self._torch_device)
        return self._streams[key]
