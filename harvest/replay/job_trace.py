"""A job-arrival trace run through the JobSet on a simulated clock: deadline attainment and tokens trained of
the scheduler (least slack) against FIFO and one-at-a-time (today's `--finetune`: one job per worker, a
worker restart between jobs). The harvest is a constant rate here (the rate `harvest replay --simulate`
measures for a request trace); decode is not simulated, so steps in target are not reported by this module.

    python -m harvest.replay.job_simulation TRACE.jsonl --tokens-per-s R --out DIR
"""

import argparse
import json
import math
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from base.errors import HarvestError
from harvest.jobs.job_set import JobSet
from harvest.jobs.job_spec import JobSpec
from harvest.replay.simulated_job import SimClock, SimulatedJob

POLICIES = ("slack", "fifo", "one-at-a-time")


@dataclass(frozen=True, slots=True)
class JobArrival:
    arrival_s: float
    name: str
    total_tokens: float
    deadline_s: float | None = None
    """Absolute, on the trace's clock; None: no deadline."""
    priority: int = 0


def load_job_trace(path: str | Path) -> list[JobArrival]:
    """One JSON object per line; a bad line is a HarvestError naming the line and the problem."""
    arrivals = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            arrivals.append(JobArrival(**json.loads(line)))
        except (ValueError, TypeError) as e:
            raise HarvestError(f"{path}:{line_no}: not a job arrival ({e})") from None
    return sorted(arrivals, key=lambda a: a.arrival_s)


def synthetic_job_trace(num_jobs: int, tokens_per_s: float, load: float, seed: int) -> list[JobArrival]:
    """Poisson arrivals at `load` x the harvest rate, log-normal sizes, half with a deadline of 1.1-3x the
    job's solo time after its arrival, priorities 0 or 1."""
    rng = random.Random(seed)
    mean_tokens = 200 * tokens_per_s  # a job is ~200 s of the whole harvest
    arrivals, t_s = [], 0.0
    for i in range(num_jobs):
        t_s += rng.expovariate(load * tokens_per_s / mean_tokens)
        size = mean_tokens * math.exp(rng.gauss(0, 0.6) - 0.18)
        deadline = t_s + size / tokens_per_s * rng.uniform(1.1, 3.0) if rng.random() < 0.5 else None
        arrivals.append(JobArrival(round(t_s, 3), f"job{i:03d}", round(size), deadline and round(deadline, 3),
                                   rng.randint(0, 1)))
    return arrivals


def simulate(arrivals: list[JobArrival], policy: str, tokens_per_s: float, unit_ms: float = 100.0,
             restart_s: float = 60.0, switch_s: float = 2.0) -> dict:
    """Run the trace to its end; every job is submitted best effort, so all policies schedule the same set.
    A switch between jobs costs `switch_s` of harvest (the incoming window is fetched again)."""
    if policy not in POLICIES:
        raise HarvestError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}")
    clock = SimClock()
    job_set = JobSet(clock, prior_tokens_per_s=tokens_per_s, policy="slack" if policy == "slack" else "fifo")
    pending = list(arrivals)
    finished_names: set[str] = set()
    num_switches = 0
    while pending or any(not m.is_done for m in job_set.members.values()):
        while pending and pending[0].arrival_s <= clock.t_s:
            a = pending.pop(0)
            job = SimulatedJob(clock, unit_ms, tokens_per_s)
            job.is_ready = True
            job_set.submit(JobSpec(a.name, "", a.total_tokens, a.priority, a.deadline_s, True, None, a.arrival_s),
                           job)
        job_set.poll()
        if not job_set.has_ready_work():
            clock.t_s = max(clock.t_s, pending[0].arrival_s)
            continue
        job_set.run_unit()
        clock.advance_ms(switch_s * 1e3 * (job_set.num_switches - num_switches))
        num_switches = job_set.num_switches
        done = {n for n, m in job_set.members.items() if m.is_done} - finished_names
        if done and policy == "one-at-a-time":
            clock.advance_ms(restart_s * 1e3 * len(done))  # the worker restarts to take the next --finetune
        finished_names |= done
    return summarize(arrivals, job_set, policy)


def summarize(arrivals: list[JobArrival], job_set: JobSet, policy: str) -> dict:
    with_deadline = [a for a in arrivals if a.deadline_s is not None]
    met = [a for a in with_deadline if job_set.members[a.name].finished_s <= a.deadline_s]
    finish = {a.name: job_set.members[a.name].finished_s for a in arrivals}
    return {
        "policy": policy,
        "num_jobs": len(arrivals),
        "num_with_deadline": len(with_deadline),
        "num_deadlines_met": len(met),
        "deadline_attainment": round(len(met) / len(with_deadline), 4) if with_deadline else None,
        "tokens_trained": round(sum(m.num_trained_tokens for m in job_set.members.values())),
        "mean_completion_s": round(sum(finish[a.name] - a.arrival_s for a in arrivals) / len(arrivals), 1),
        "makespan_s": round(max(finish.values()), 1),
        "num_switches": job_set.num_switches,
    }


def table(rows: list[dict]) -> str:
    head = ["policy", "deadlines met", "attainment", "tokens trained", "mean completion s", "makespan s",
            "switches"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join(str(x) for x in (
            r["policy"], f"{r['num_deadlines_met']}/{r['num_with_deadline']}", r["deadline_attainment"],
            r["tokens_trained"], r["mean_completion_s"], r["makespan_s"], r["num_switches"])))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harvest.replay.job_simulation", description=__doc__.split("\n")[0])
    parser.add_argument("trace", help="job-arrival trace (JSONL); 'synthetic:N:LOAD:SEED' generates one")
    parser.add_argument("--tokens-per-s", type=float, required=True, help="the measured harvest rate")
    parser.add_argument("--restart-s", type=float, default=60.0, help="one-at-a-time's worker restart")
    parser.add_argument("--switch-s", type=float, default=2.0, help="harvest lost per switch between jobs")
    parser.add_argument("--out", help="directory for results.json, table.md and the trace used")
    args = parser.parse_args(argv)
    try:
        if args.tokens_per_s <= 0:
            raise HarvestError(f"--tokens-per-s: {args.tokens_per_s} must be > 0")
        if args.trace.startswith("synthetic:"):
            _, num, load, seed = args.trace.split(":")
            arrivals = synthetic_job_trace(int(num), args.tokens_per_s, float(load), int(seed))
        else:
            arrivals = load_job_trace(args.trace)
        rows = [simulate(arrivals, p, args.tokens_per_s, restart_s=args.restart_s, switch_s=args.switch_s)
                for p in POLICIES]
    except (HarvestError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = {"trace": args.trace, "tokens_per_s": args.tokens_per_s, "restart_s": args.restart_s,
              "switch_s": args.switch_s, "rows": rows}
    print(json.dumps(result))
    print(table(rows))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "table.md").write_text(table(rows) + "\n")
        (out / "job_trace.jsonl").write_text("".join(json.dumps(asdict(a)) + "\n" for a in arrivals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
