"""The fleet's torchft lighthouse as a process of its own (harvest.fleet.lighthouse_server), started and
health-checked on its /status page: what `harvest deploy --decode-workers N` and `harvest bench fleet` run."""

import sys
from pathlib import Path

from base.errors import HarvestError
from harvest.worker.process import WorkerProcess


def lighthouse_process(host: str, port: int, log_path: Path, env: dict[str, str] | None = None,
                       join_timeout_ms: int | None = None) -> WorkerProcess:
    """The lighthouse, unstarted (`join_timeout_ms`: how long a round waits for late members; None: the
    server's default)."""
    command = [sys.executable, "-m", "harvest.fleet.lighthouse_server", "--bind", f"{host}:{port}"]
    if join_timeout_ms is not None:
        command += ["--join-timeout-ms", str(join_timeout_ms)]
    return WorkerProcess([], None, 0, log_path, command=command, env=env)


def start_lighthouse(lighthouse: WorkerProcess, port: int, timeout_s: float) -> None:
    """Launch it and wait until /status answers; one-line HarvestError (naming its log) if it exits or does not."""
    lighthouse.launch()
    try:
        ready = lighthouse.wait_until_ok("/status", timeout_s, "lighthouse", port=port)
    except HarvestError as e:
        raise HarvestError(f"fleet lighthouse: {e}") from None
    if not ready:
        raise HarvestError(f"fleet lighthouse: not answering on port {port} after {timeout_s:.0f} s; "
                           f"log: {lighthouse.log_path}")
