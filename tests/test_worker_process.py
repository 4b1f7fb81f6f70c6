"""`WorkerProcess` starts the process it was given and takes no other server's answer for its own."""

import random
import sys
import time

import pytest

from base.errors import HarvestError
from harvest.worker.process import WorkerProcess, free_ports


def test_ports_do_not_follow_the_seed_a_finetune_sets():
    """An in-process finetune seeds `random` (LlamaFactory's set_seed); two test processes that both did
    drew the same ports and one test's requests reached the other's worker."""
    random.seed(42)
    first = free_ports(2)
    random.seed(42)
    assert free_ports(2) != first


def server(tmp_path, name, port, code):
    worker = WorkerProcess([], None, 0, tmp_path / f"{name}.log", command=[sys.executable, "-c", code])
    worker.port = port  # the port the process was told to serve on; `None` above adds no --port flag
    return worker.launch()


def test_an_answer_from_another_process_on_the_port_is_not_readiness(tmp_path):
    port = free_ports(1)[0]
    other = server(tmp_path, "other", port, f"import http.server as h; h.test(h.SimpleHTTPRequestHandler, "
                                            f"port={port}, bind='127.0.0.1')")
    try:
        assert other.wait_until_ok("/", 30, "the other server")
        silent = server(tmp_path, "silent", port, "import time; time.sleep(60)")
        try:
            started = time.monotonic()
            assert not silent.wait_until_ok("/", 3, "the silent process")
            assert time.monotonic() - started >= 3
        finally:
            silent.stop()
        failed = server(tmp_path, "failed", port, "print('[Errno 98] Address already in use', flush=True); "
                                                  "import time; time.sleep(60)")
        try:
            with pytest.raises(HarvestError, match=f"port {port} is served by another process"):
                failed.wait_until_ok("/", 30, "the failed process")
        finally:
            failed.stop()
    finally:
        other.stop()
