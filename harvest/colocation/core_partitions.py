"""CPU core sets as partitions: spatial co-location on a CPU host.

A partition (infer_cores, ft_cores) gives decode the first infer_cores of the worker's cores and the
finetune job the next ft_cores; a profile's "SMs" are cores here (the grid's units). A thread enters a
partition by pinning itself (`os.sched_setaffinity` on its own thread id) and setting its torch intra-op
thread count, which in this torch build (OpenMP) is per calling thread: the scheduler thread's decode and
the unit thread's finetune each get their own team, on their own cores (eval/README.md, "Spatial
co-location on CPU cores", has the measurement). OpenMP workers a team already made keep the affinity
they were created with, so whole-device teams are made first, in a thread that holds every core.

Deferred imports: torch only where a CUDA device's SM count is read; the host's partitions need none.
"""

import contextlib
import os
import threading

from base.errors import HarvestError
from predictor.partition_grid import PartitionGrid


class CorePartitions:
    def __init__(self, pairs: list[tuple[int, int]] | None, cores: list[int] | None = None):
        """`pairs`: the (infer_cores, ft_cores) partitions the planner may pick (None: every one these cores
        form, as GreenPartitions); `cores`: the cores this worker may use (default: its affinity). A pair
        needing more cores than there are is an error."""
        self.cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
        self.num_sms = len(self.cores)
        self.granularity = 1
        self.grid = PartitionGrid(self.num_sms, self.granularity)
        if pairs is None:
            pairs = [*((i, 0) for i in self.grid.infer_options()), *self.grid.pairs()]
        too_large = [p for p in pairs if p[0] + p[1] > self.num_sms or p[0] < 1]
        if too_large:
            raise HarvestError(f"the profile's core partitions {too_large} need more than this worker's "
                               f"{self.num_sms} cores {self.cores}: profile this host with `harvest profile --co-run`")
        self._pairs = list(pairs)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return list(self._pairs)

    def can_form(self, infer_cores: int, ft_cores: int) -> bool:
        return infer_cores >= 1 and ft_cores >= 0 and infer_cores + ft_cores <= self.num_sms

    def decode_cores(self, infer_cores: int) -> list[int]:
        return self.cores[:infer_cores]

    def finetune_cores(self, infer_cores: int, ft_cores: int) -> list[int]:
        return self.cores[infer_cores:infer_cores + ft_cores]

    def decode_context(self, infer_cores: int, ft_cores: int):
        return on_cores(self.decode_cores(infer_cores))

    def decode_stream(self, infer_cores: int, ft_cores: int):
        """A CPU host has no streams: decode runs on the scheduler thread, moved by decode_context."""
        return None

    def finetune_context(self, infer_cores: int, ft_cores: int):
        return on_cores(self.finetune_cores(infer_cores, ft_cores))

    def whole_device_context(self):
        return on_cores(self.cores)


@contextlib.contextmanager
def on_cores(cores: list[int]):
    """Run the calling thread (and the torch ops it launches) on `cores`; restore its cores after."""
    import torch

    tid = threading.get_native_id()
    before_cores, before_threads = os.sched_getaffinity(tid), torch.get_num_threads()
    os.sched_setaffinity(tid, cores)
    torch.set_num_threads(len(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(tid, before_cores)
        torch.set_num_threads(before_threads)
