import os
import sys

import pytest
from hypothesis import settings

from harvest.colocation.finetune_job import FinetuneState
from harvest.worker.process import free_ports

# Test processes share the harvest conventions of the CLI edge: no hub access, SGLang's CPU engine on CPU hosts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Property tests assert properties, not speed: a shared host (or the other test process of `make test`) can
# make one example slower than hypothesis' default 200 ms deadline.
settings.register_profile("harvest", deadline=None)
settings.load_profile("harvest")


# The bound on one test (its module's fixtures included) by its kind, each at least 3x the slowest run seen
# (tests/durations.txt); pytest's `timeout` in pyproject.toml bounds the rest.
TIMEOUT_S_BY_MARK = {"bundle": 1800, "sglang": 1800, "trainer": 300}


def pytest_collection_modifyitems(config, items):
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; this host has none")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if item.get_closest_marker("timeout") is None:
            bounds = [s for mark, s in TIMEOUT_S_BY_MARK.items() if mark in item.keywords]
            if bounds:
                item.add_marker(pytest.mark.timeout(max(bounds)))


_running: list[pytest.Item] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _running[:] = [item]  # before its fixtures, so a module fixture's worker is checked against its first test


def pytest_configure(config):
    """`make check` leaves out `sglang` and `trainer` tests: a test that starts a worker or a trainer without
    its mark would slow the developer's loop, so the start fails, naming the mark it needs."""
    from harvest.worker.process import WorkerProcess

    launch = WorkerProcess.launch

    def checked_launch(self):
        marks = {m.name for m in _running[0].iter_markers()} if _running else {"sglang"}
        text = " ".join(self.argv)
        needs = ("trainer" if "llamafactory" in text or "harvest.cli.main finetune" in text
                 else "sglang" if "sglang" in text or "harvest.cli.main serve" in text else None)
        if needs and not marks & {needs, "sglang", "bundle"}:
            raise AssertionError(f"{_running[0].nodeid} starts {' '.join(self.argv[:5])}: mark it {needs}")
        return launch(self)

    WorkerProcess.launch = checked_launch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Opt in per module with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`.

    Measured on the shared 2-core host: a 3-step tiny-Llama run took 0.8 s with 1 torch thread and
    16-30 s with 2 while other processes were busy (OpenMP threads spin against each other).
    Module-scoped, so it is set before the modules' own module-scoped training fixtures run.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from harvest.models.tiny_llama import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


def free_port() -> int:
    return free_ports(1)[0]


@pytest.fixture
def harvest_cli():
    """Argv prefix that runs the harvest CLI of this checkout in this interpreter."""
    return [sys.executable, "-m", "harvest.cli.main"]


def lora_state_dict(engine) -> dict:
    """A copy of the engine's LoRA weights on the host, to compare runs."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().to("cpu").clone() for k, v in get_peft_model_state_dict(engine.peft_model).items()}


def pytest_sessionfinish(session):
    """The fault cases' figures, written per case by the test processes, merged once by the controlling one."""
    if hasattr(session.config, "workerinput"):
        return
    from faults.figures import CASES_DIR, merge

    if CASES_DIR.exists() and any(CASES_DIR.glob("*.json")):
        merge()


def kill_tree(pid: int) -> None:
    """kill -9 of a process and every process under it at once, as a crashed machine would."""
    import signal

    import psutil

    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        process.send_signal(signal.SIGKILL)


def run_fleet(target, replicas: list[tuple], timeout_s: float) -> dict:
    """Each replica a spawned process running `target(lighthouse_address, *args, queue)` against one torchft
    lighthouse (min_replicas: all of them); returns {first item of each report: the rest}, one report a process."""
    import multiprocessing

    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=len(replicas))
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=target, args=(lighthouse.address(), *args, queue)) for args in replicas]
    for process in processes:
        process.start()
    try:
        return {key: rest for key, *rest in (queue.get(timeout=timeout_s) for _ in processes)}
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        lighthouse.shutdown()


class AlwaysReadyJob:
    """FinetuneJob's scheduler-side interface with one unit kind always ready; a test's job adds its units and
    what it records about them."""

    state = FinetuneState.RUNNING
    is_active = True
    requested_unit_ms = None

    def has_ready_work(self):
        return True

    def next_unit_kind(self):
        return "unit"

    def next_unit_predicted_ms(self):
        return None

    def note_no_room(self):
        pass

    def request_unit_bound(self, max_unit_ms):
        self.requested_unit_ms = max_unit_ms
