"""The device `harvest profile` measures, whichever kind its partitions are: core sets of a CPU host
(CorePartitions) or SM partitions of a GPU on green contexts (GreenPartitions). Both are built over every
partition the device forms, the same two classes the worker's SpatialController runs on, so the profiler
samples exactly the partitions a worker can be pinned to and the planner can later pick.

What differs by kind, and why:
  - the name a profile records: the CPU model, or the GPU's name as its driver reports it;
  - the finetune job's torch device ("cpu", "cuda:0");
  - the solo-only grid: the whole device as one partition. A CPU host counts as one unit there (the "cpu"
    preset every CPU solo profile has recorded); a GPU counts its SMs, so `ft_sms` in the profile's finetune
    throughput and the whole-device partition are in the units its co-run profile and planner use;
  - how few partitions co-run needs: two cores on a CPU; on a GPU, a driver split of at least two groups.
"""

import platform
from dataclasses import dataclass
from pathlib import Path

from base.errors import HarvestError
from harvest.colocation.core_partitions import CorePartitions
from harvest.colocation.green_partitions import GreenPartitions
from predictor.partition_grid import PartitionGrid
from predictor.sampling_plan import SamplePoint

GPU_INDEX = 0
"""The device the profiling worker runs on: SGLang's first visible GPU (CUDA_VISIBLE_DEVICES picks it)."""


@dataclass(frozen=True)
class ProfiledDevice:
    name: str
    """As a profile records it (Profile.device_name)."""
    partitions: object
    """CorePartitions or GreenPartitions over every partition the device forms."""
    finetune_device: str
    """Torch device of the finetune job the profiler times alone (FinetuneProfiler)."""
    solo_grid: PartitionGrid
    """The grid of a solo-only profile: the whole device, one partition."""

    @property
    def is_gpu(self) -> bool:
        return self.finetune_device.startswith("cuda")

    def grid(self, co_run: bool) -> PartitionGrid:
        """The partition grid the sampling plan spans: every partition with --co-run, else the whole device."""
        return self.partitions.grid if co_run else self.solo_grid

    def check_co_run(self) -> None:
        """HarvestError when this device cannot form a co-run partition."""
        if not any(f > 0 for _, f in self.partitions.pairs):
            what = (f"the driver split its {self.partitions.num_sms} SMs into groups {self.partitions.group_sms}"
                    if self.is_gpu else f"this process may use {self.partitions.num_sms} core(s)")
            raise HarvestError(f"--co-run needs at least two partitions of the device to co-run on; {what}")

    def measurable(self, points: list[SamplePoint], co_run: bool) -> tuple[list[SamplePoint], list[tuple[int, int]]]:
        """The plan's points a worker can be pinned to, and the partitions dropped (a GPU's driver split may
        not form every partition of the granularity grid: group_runs in green_partitions.py)."""
        if not co_run:
            return points, []
        formed = set(self.partitions.pairs)
        dropped = sorted({(p.infer_sms, p.ft_sms) for p in points} - formed)
        return [p for p in points if (p.infer_sms, p.ft_sms) in formed], dropped

    def finetune_context(self, ft_sms: int):
        """Where the job runs alone on ft_sms: the finetune side of the formed partition with the largest
        decode side, i.e. the device's last ft_sms units (on a CPU, the cores the co-run units had on 2 cores)."""
        infer_sms = max((i for i, f in self.partitions.pairs if f == ft_sms), default=None)
        if infer_sms is None:
            raise HarvestError(f"no partition of this device gives the finetune job {ft_sms} units")
        return self.partitions.finetune_context(infer_sms, ft_sms)


def local_device() -> ProfiledDevice:
    """The device this host profiles: its GPU where a CUDA driver is, else its CPU cores."""
    from base.cuda_driver import has_real_driver  # deferred: test_gpu_twin's H100 stand-in patches it

    if has_real_driver():
        return gpu_device(GPU_INDEX)
    return cpu_device()


def cpu_device(cores: list[int] | None = None) -> ProfiledDevice:
    return ProfiledDevice(cpu_model_name(), CorePartitions(None, cores), "cpu", PartitionGrid.from_name("cpu"))


def gpu_device(index: int) -> ProfiledDevice:
    try:
        partitions = GreenPartitions(index, None)
    except (ImportError, RuntimeError) as e:
        raise HarvestError(f"profiling GPU {index} needs its SM partitions (green contexts, CUDA >= 12.4): {e}") \
            from None
    grid = PartitionGrid(partitions.num_sms, partitions.num_sms)
    return ProfiledDevice(partitions.device_name, partitions, f"cuda:{index}", grid)


def cpu_model_name() -> str:
    """What to call this host's processor in a profile."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"
