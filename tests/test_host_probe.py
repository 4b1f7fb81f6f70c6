import os

import pytest
import torch

from harvest.bench.host_probe import probe_host


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="crossing cores needs two")
def test_the_probe_measures_both_and_leaves_the_callers_threads_and_cores_as_they_were():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # not the probe's last count (1 or 2 in turn): the caller's must come back
    try:
        cores = os.sched_getaffinity(0)
        host = probe_host()
        assert host["ping_pong_us"] > 0
        assert set(host["decode_loop_ms"]) == {1, 2} and all(ms > 0 for ms in host["decode_loop_ms"].values())
        assert torch.get_num_threads() == 2 and os.sched_getaffinity(0) == cores
    finally:
        torch.set_num_threads(before)
