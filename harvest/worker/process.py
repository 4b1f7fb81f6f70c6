"""Start `harvest serve` as a child process, wait until it serves, stop it cleanly.

Used by `harvest demo`, the benchmarks and the end-to-end tests: the same process a user runs.
"""

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from base.errors import HarvestError


class WorkerProcess:
    def __init__(self, args: list[str], port: int | None, admin_port: int, log_path: Path,
                 command: list[str] | None = None, env: dict | None = None, stop_with_parent: bool = False):
        """`command` defaults to `harvest serve`; `args` follow it (the port flags are added here; `port` None:
        a process that serves nothing, such as a trainer, gets none and is started with `launch`).
        `stop_with_parent`: the process gets SIGTERM when the thread that started it dies, even by kill -9
        (PR_SET_PDEATHSIG): start it from a thread that lives as long as it should."""
        self.port = port
        self.admin_port = admin_port
        self.log_path = Path(log_path)
        self._argv = [*(command or [sys.executable, "-m", "harvest.cli.main", "serve"]), *args]
        if port is not None:
            self._argv += ["--port", str(port)]
        if command is None:
            self._argv += ["--admin-port", str(admin_port)]
        self._has_admin = command is None and port is not None
        self._env = {**os.environ, **(env or {})}
        self._preexec = _sigterm_when_parent_dies if stop_with_parent else None
        self.proc: subprocess.Popen | None = None
        self.killed = False  # whether stop() had to SIGKILL it

    @property
    def argv(self) -> list[str]:
        """The command line it runs (or will run)."""
        return list(self._argv)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout_s: float = 300.0) -> "WorkerProcess":
        self.launch()
        self._wait_ready(timeout_s)
        return self

    def launch(self) -> "WorkerProcess":
        """Start the process without waiting for it to serve."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            # Own process group: a signal meant for the worker never reaches whoever started it.
            self.proc = subprocess.Popen(self._argv, stdout=log, stderr=subprocess.STDOUT, env=self._env,
                                         start_new_session=True, preexec_fn=self._preexec)  # noqa: PLW1509
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        is_ready = self.wait_until_ok("/health", timeout_s, "worker")
        if is_ready and self._has_admin:
            # The admin API starts with the scheduler, before /health answers; still, a test or benchmark
            # reading stats from a port another process holds must fail here, not with that process's answers.
            is_ready = self.wait_until_ok("/healthz", max(deadline - time.monotonic(), 5.0), "worker",
                                          port=self.admin_port)
        if not is_ready:
            self.stop()
            raise HarvestError(f"worker not ready after {timeout_s:.0f} s; log: {self.log_path}")

    def wait_until_ok(self, path: str, timeout_s: float, what: str, port: int | None = None) -> bool:
        """Poll GET `path` on `port` (default: the worker's) until this process answers 200 there (True) or
        `timeout_s` passes (False); raises if the process exits meanwhile."""
        port = self.port if port is None else port
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarvestError(f"{what} exited with {self.proc.returncode} while starting; log: {self.log_path}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code == 200:
                    if self._listens_on(port):
                        return True
                    if self._bind_failed():
                        raise HarvestError(f"port {port} is served by another process; log: {self.log_path}")
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        return False

    def _listens_on(self, port: int) -> bool:
        """Whether this process or one of its children listens on `port` (an answer on it may be another's)."""
        try:
            root = psutil.Process(self.proc.pid)
            for proc in [root, *root.children(recursive=True)]:
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                       for c in proc.net_connections(kind="tcp")):
                    return True
        except psutil.Error:
            pass
        return False

    def _bind_failed(self) -> bool:
        return "address already in use" in self.log_path.read_text(errors="replace").lower()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Signal the worker, wait for it and its children; kill what is left. Returns the exit code."""
        if self.proc is None:
            return 0
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.killed = True
            code = self.proc.wait()
        _, alive = psutil.wait_procs(children, timeout=10)
        for child in alive:
            child.kill()
        self.orphans = alive
        return code

    def __enter__(self) -> "WorkerProcess":
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # looked up before any fork: the child only makes the call


def _sigterm_when_parent_dies() -> None:
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# Not the `random` module's generator: an in-process finetune seeds it (LlamaFactory's set_seed), and two
# test processes that seeded it alike drew the same ports, so one test's requests reached the other's worker.
_PORT_DRAW = random.SystemRandom()


def free_ports(count: int) -> list[int]:
    """Distinct free ports below the kernel's ephemeral range: SGLang's own free ports (its gloo/NCCL port)
    and every outgoing connection's local port come from that range, so a port drawn there can be taken
    between drawing it and the worker binding it. SGLang also derives side ports (gRPC = port + 3000)."""
    top = _ephemeral_low()
    ports = []
    for port in _PORT_DRAW.sample(range(20000, top), 400):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        if all(abs(port - p) > 10 for p in ports):
            ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no free ports in 20000-{top}")


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    return max(low, 25000)
