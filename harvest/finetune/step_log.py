"""StepLog: the job's per-step JSON lines log in output_dir, and the running figures its stats report."""

import json
from pathlib import Path
from typing import Any


class StepLog:
    def __init__(self, path: Path, resumed_step: int | None = None):
        """A new job starts an empty log; one resumed at `resumed_step` keeps its records up to that step
        (the steps after the checkpoint are run, and logged, again)."""
        self.path = path
        kept = []
        if resumed_step is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            kept = [line for line in path.read_text().splitlines() if line.strip()]
            kept = [line for line in kept if json.loads(line)["step"] <= resumed_step]
        path.write_text("".join(line + "\n" for line in kept))
        self.last: dict[str, Any] = {"loss": None, "tokens_per_s": None, "grad_norm": None, "lr": None}
        self.total_tokens = 0
        self.total_ms = 0.0

    def record(self, step: int, loss: float, num_tokens: int, step_ms: float, window: int) -> None:
        self.total_tokens += num_tokens
        self.total_ms += step_ms
        self.last["loss"] = loss
        self.last["tokens_per_s"] = num_tokens / (step_ms / 1e3) if step_ms else None
        record = {
            "step": step,
            "loss": loss,
            "lr": self.last["lr"],
            "grad_norm": self.last["grad_norm"],
            "num_tokens": num_tokens,
            "step_ms": step_ms,
            "tokens_per_s": self.last["tokens_per_s"],
            "window": window,
        }
        with self.path.open("a") as log:
            log.write(json.dumps(record) + "\n")

    @property
    def mean_tokens_per_s(self) -> float | None:
        return self.total_tokens / (self.total_ms / 1e3) if self.total_ms else None
