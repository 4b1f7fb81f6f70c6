"""Train a LlamaFactory job as one fleet replica in this process: the finetune engine's step loop with
FleetSync's hook at each optimizer-step boundary. The fleet's tests and live measurements use it; inside
a decode worker the co-location job's loop calls the same hook."""

import time
from pathlib import Path
from typing import Any

from harvest.finetune import FinetuneEngine
from harvest.finetune.publishing import adapter_tensors
from harvest.fleet.fleet_member import trainable_named_params
from harvest.fleet.fleet_sync import FleetSync
from harvest.fleet.round_checkpoint import write_round_checkpoint
from harvest.fleet.round_policy import RoundPolicy


def run_replica(job_path: str | Path, lighthouse_addr: str, replica_id: str, policy: RoundPolicy,
                min_members: int = 1, wait_each_round: bool = False, overrides: dict[str, Any] | None = None,
                checkpoint_dir: str | Path | None = None) -> dict[str, Any]:
    """Train the job to its end; returns the adapter (PEFT names -> tensors), the rounds and timing.
    `wait_each_round`: apply each round before the next step (the equivalence test's lockstep)."""
    engine = FinetuneEngine.from_yaml(job_path, overrides)
    named = trainable_named_params(engine)
    fleet = FleetSync(list(named.values()), policy, lighthouse_addr, replica_id, min_members)
    rounds, tokens, started = [], 0, time.perf_counter()
    while not engine.is_finished:
        step_tokens = 0
        while True:
            result = engine.run_next_unit()
            step_tokens += result.num_trained_tokens
            if result.is_step_end:
                break
        tokens += step_tokens
        applied = fleet.on_step_end(step_tokens)
        if wait_each_round:
            applied = fleet.wait() or applied
        if applied is not None:
            rounds.append(applied)
            if checkpoint_dir is not None and applied.committed and applied.is_writer:
                write_round_checkpoint(dict(zip(named, fleet.base_tensors())), applied.round, checkpoint_dir)
    last = fleet.wait()
    if last is not None:
        rounds.append(last)
    elapsed_s = time.perf_counter() - started
    adapter = adapter_tensors(engine.peft_model)
    stats = fleet.stats()
    fleet.close()
    return {"adapter": adapter, "rounds": rounds, "tokens": tokens, "steps": engine.global_step,
            "elapsed_s": elapsed_s, "stats": stats}
