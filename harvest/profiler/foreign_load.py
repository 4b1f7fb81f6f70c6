"""How much CPU other processes took while a measurement ran: the host's busy time (/proc/stat, steal
included) minus the time of our own process trees, in cores. On a shared 2-core host a decode step that
shares its cores with another job is ~20-40% slower; this says when that happened, so the profiler can
measure that point again instead of guessing from the latency alone."""

import time

import psutil


class ForeignLoad:
    def __init__(self, pids: list[int]):
        self.pids = pids
        self.cores: float | None = None
        """Mean cores used by processes outside `pids` over the block; set on exit."""

    def __enter__(self) -> "ForeignLoad":
        self._start = (time.perf_counter(), _host_busy_s(), _tree_cpu_s(self.pids))
        return self

    def __exit__(self, *exc) -> None:
        wall_s, busy_s, ours_s = (now - then for now, then in
                                  zip((time.perf_counter(), _host_busy_s(), _tree_cpu_s(self.pids)), self._start))
        self.cores = max(0.0, busy_s - ours_s) / max(wall_s, 1e-3)


def _host_busy_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def _tree_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in processes:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
    return total
