"""The job-arrival trace beside the request trace (`harvest replay --simulate --jobs`): the harvest policy's
controller drives a SimulatedJobSet once per job policy, on the same request trace, and each run reports its
deadlines met, tokens trained and steps in target (results.json's "jobs" section).

A run serves the whole request trace, then finetunes on the idle device until every job has finished, so
each deadline is judged; `tokens_trained` counts what was trained while requests were served.
"""

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np

from base.errors import HarvestError
from harvest.replay.colocation_policies import HarvestPolicy
from harvest.replay.decode_simulator import DecodeSimulator
from harvest.replay.job_trace import JobArrival, SyntheticJobs
from harvest.replay.simulated_job_set import JOB_POLICIES, SimulatedJobSet


@dataclass(frozen=True, slots=True)
class JobReplay:
    source: list[JobArrival] | SyntheticJobs
    """The loaded trace, or the synthetic one to draw at the measured harvest rate (job_trace.load_jobs)."""
    spec: str
    """As given to --jobs."""
    switch_s: float = 2.0
    restart_s: float = 60.0

    def arrivals(self, harvest_tokens_per_s: float, span_s: float) -> list[JobArrival]:
        if isinstance(self.source, SyntheticJobs):
            return self.source.generate(harvest_tokens_per_s, span_s)
        return self.source

    def run(self, simulation, trace, harvest_tokens_per_s: float) -> dict:
        """`simulation`: the ReplaySimulation (profile, memory, rates, config); `harvest_tokens_per_s`: the
        single-job harvest policy's decode-device rate on this trace (sizes a synthetic trace; the sets'
        prior rate)."""
        if not (harvest_tokens_per_s > 0 and trace.duration_s > 0):
            raise HarvestError(f"--jobs: the harvest policy trained {harvest_tokens_per_s:.0f} tokens/s over "
                               f"{trace.duration_s:.0f} s of requests: no harvest to run jobs on")
        arrivals = self.arrivals(harvest_tokens_per_s, trace.duration_s)
        rows = {p: self.run_policy(simulation, trace, arrivals, p, harvest_tokens_per_s) for p in JOB_POLICIES}
        return {
            "spec": self.spec,
            "num_jobs": len(arrivals),
            "num_with_deadline": sum(a.deadline_s is not None for a in arrivals),
            "total_tokens": round(sum(a.total_tokens for a in arrivals)),
            "harvest_tokens_per_s": round(harvest_tokens_per_s, 3),
            "load": round(sum(a.total_tokens for a in arrivals) / harvest_tokens_per_s / trace.duration_s, 4),
            "switch_s": self.switch_s,
            "restart_s": self.restart_s,
            "policies": rows,
            "arrivals": [asdict(a) for a in arrivals],
        }

    def run_policy(self, simulation, trace, arrivals: list[JobArrival], job_policy: str,
                   prior_tokens_per_s: float) -> dict:
        make_job = functools.partial(SimulatedJobSet, arrivals=arrivals, policy=job_policy,
                                     prior_tokens_per_s=prior_tokens_per_s, switch_s=self.switch_s,
                                     restart_s=self.restart_s)
        policy = HarvestPolicy(simulation.profile, simulation.memory, simulation.rates, simulation.config,
                               make_job=make_job)
        run = DecodeSimulator(policy).run(trace)
        job_set: SimulatedJobSet = policy.job
        tokens_while_serving = job_set.num_trained_tokens
        measured_rate = job_set.harvest_tokens_per_s()
        policy.idle(run.end_s, math.inf)  # finetune on the idle device until every job has finished
        return summarize_jobs(arrivals, job_set, tokens_while_serving, measured_rate,
                              run.step_latency_ms, simulation.config.tpot_slo_ms, run.end_s)


def summarize_jobs(arrivals: list[JobArrival], job_set: SimulatedJobSet, tokens_while_serving: float,
                   measured_tokens_per_s: float | None, step_latency_ms: np.ndarray, tpot_slo_ms: float,
                   serve_end_s: float) -> dict:
    finish = {a.name: job_set.members[a.name].finished_s if a.name in job_set.members else None for a in arrivals}
    with_deadline = [a for a in arrivals if a.deadline_s is not None]
    met = [a for a in with_deadline if finish[a.name] is not None and finish[a.name] <= a.deadline_s]
    done = [a for a in arrivals if finish[a.name] is not None]
    return {
        "num_deadlines_met": len(met),
        "num_with_deadline": len(with_deadline),
        "deadline_attainment": round(len(met) / len(with_deadline), 4) if with_deadline else None,
        "tokens_trained": round(tokens_while_serving),
        "tokens_trained_total": round(job_set.num_trained_tokens),
        "num_jobs_finished": len(done),
        "num_jobs_finished_while_serving": sum(finish[a.name] <= serve_end_s for a in done),
        "step_slo_attainment": float(np.mean(step_latency_ms <= tpot_slo_ms)) if len(step_latency_ms) else None,
        "measured_harvest_tokens_per_s": None if measured_tokens_per_s is None else round(measured_tokens_per_s, 3),
        "mean_completion_s": round(sum(finish[a.name] - a.arrival_s for a in done) / len(done), 1) if done else None,
        "makespan_s": round(max(finish[a.name] for a in done), 1) if done else None,
        "serve_end_s": round(serve_end_s, 1),
        "num_switches": job_set.num_switches,
    }
