"""`llamafactory-cli train` as a child process beside a decode worker, and the tokens it trains over time.

The trainer counts tokens as harvest's job does: non-padding tokens, the attention mask's sum (the HF
Trainer's `include_num_input_tokens_seen: non_padding`), which LlamaFactory writes as `total_tokens` into
output_dir/trainer_log.jsonl at every logging step. A thread stamps each new line with the wall time it
appeared (polled every POLL_S), and the tokens trained between two instants are interpolated linearly
between stamped lines: one optimizer step (a few seconds on a CPU) is the resolution.
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from base.errors import HarvestError
from harvest.worker.process import WorkerProcess

POLL_S = 0.2
LOG_NAME = "trainer_log.jsonl"


class TrainerProcess:
    def __init__(self, job: dict, work_dir: Path, cpus: list[int] | None = None, num_threads: int | None = None):
        """`job`: the LlamaFactory config as a dict (absolute paths); `cpus`: run under `taskset -c`;
        `num_threads`: OMP_NUM_THREADS for the trainer."""
        work_dir.mkdir(parents=True, exist_ok=True)
        self.output_dir = work_dir / "output"
        config = {**job, "output_dir": str(self.output_dir), "overwrite_output_dir": True,
                  "include_num_input_tokens_seen": "non_padding", "logging_steps": 1,
                  "max_steps": 10**6, "save_steps": 10**9, "report_to": "none"}
        config_path = work_dir / "train.yaml"
        config_path.write_text(yaml.safe_dump(config))
        command = [str(Path(sys.executable).parent / "llamafactory-cli"), "train", str(config_path)]
        if cpus is not None:
            command = ["taskset", "-c", ",".join(map(str, cpus)), *command]
        env = {"HF_HUB_OFFLINE": "1"}
        if num_threads is not None:
            env["OMP_NUM_THREADS"] = str(num_threads)
        self._process = WorkerProcess([], None, 0, work_dir / "train.log", command=command, env=env,
                                      stop_with_parent=True)
        self._stamps: list[tuple[float, int]] = []  # (wall time the line appeared, total tokens)
        self._stop_tail = threading.Event()
        self._tail = threading.Thread(target=self._tail_log, name="trainer-log-tail", daemon=True)

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def start(self, num_warmup_steps: int, timeout_s: float) -> "TrainerProcess":
        """Launch and wait until `num_warmup_steps` steps are logged: loading and the first steps stay out
        of the measured window, as harvest's job is already running when a replay starts."""
        self._process.launch()
        self._tail.start()
        try:
            self._wait_for(lambda: len(self._stamps) >= num_warmup_steps, timeout_s, "its warm-up steps")
        except BaseException:
            self.stop()
            raise
        return self

    def wait_logged_after(self, wall_s: float, timeout_s: float) -> None:
        """Wait for a step logged after `wall_s`, so `tokens_between` can interpolate up to it."""
        self._wait_for(lambda: self._stamps and self._stamps[-1][0] > wall_s, timeout_s, "a step after the replay")

    def tokens_between(self, start_wall_s: float, end_wall_s: float) -> float:
        times, tokens = np.array(self._stamps, dtype=float).T
        return float(np.interp(end_wall_s, times, tokens) - np.interp(start_wall_s, times, tokens))

    @property
    def num_steps_logged(self) -> int:
        return len(self._stamps)

    def stop(self) -> int:
        self._stop_tail.set()
        return self._process.stop()

    def _wait_for(self, is_done, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not is_done():
            if self._process.proc.poll() is not None:
                raise HarvestError(f"llamafactory-cli train exited with {self._process.proc.returncode} before "
                                   f"{what}; log: {self.log_path}")
            if time.monotonic() > deadline:
                raise HarvestError(f"llamafactory-cli train logged no {what} in {timeout_s:.0f} s; log: {self.log_path}")
            time.sleep(POLL_S)

    def _tail_log(self) -> None:
        path, offset, pending = self.output_dir / LOG_NAME, 0, ""
        while not self._stop_tail.wait(POLL_S):
            if not path.exists():
                continue
            with open(path) as f:
                f.seek(offset)
                pending += f.read()
                offset = f.tell()
            now = time.time()
            *lines, pending = pending.split("\n")
            for line in lines:
                record = json.loads(line) if line.strip() else {}
                if "total_tokens" in record:
                    self._stamps.append((now, int(record["total_tokens"])))


def cpu_halves() -> tuple[list[int], list[int]]:
    """The cores this process may use, split in two: the static split a user would pick."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise HarvestError(f"the pinned two-process row needs at least 2 cores, this process may use {len(cpus)}")
    return cpus[: len(cpus) // 2], cpus[len(cpus) // 2 :]
