"""Prometheus metrics of one worker, in their own registry so they never mix with SGLang's."""

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from allocator.allocator_metrics import AllocatorMetrics
from harvest.step_stats import DecodeStep

# Decode steps of interest sit between ~5 ms (H100, small batch) and a few hundred ms (CPU).
STEP_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
FINETUNE_STATES = ("starting", "running", "paused", "starved", "waiting", "stopped", "failed", "finished")
JOB_STATES = ("queued", "running", "paused", "stopped", "failed", "finished", "cancelled")


class HarvestMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.decode_steps = Counter("harvest_decode_steps", "Decode steps observed", registry=r)
        self.decode_tokens = Counter("harvest_decode_tokens", "Tokens produced by decode steps", registry=r)
        self.step_latency = Histogram("harvest_step_latency_seconds", "Decode step wall time, launch to result "
                                      "processed", buckets=STEP_LATENCY_BUCKETS_S, registry=r)
        self.batch_size = Gauge("harvest_batch_size", "Batch size of the last decode step", registry=r)
        self.uptime = Gauge("harvest_uptime_seconds", "Seconds since the worker started", registry=r)
        self.slo_violations = Counter("harvest_slo_violations", "Decode steps whose time plus the finetune "
                                      "time charged to them exceeded the TPOT target", registry=r)
        self.finetune_tokens = Counter("harvest_finetune_tokens", "Tokens processed by finetune units", registry=r)
        self.finetune_step = Gauge("harvest_finetune_step", "Optimizer steps the finetune job completed", registry=r)
        self.finetune_loss = Gauge("harvest_finetune_loss", "Loss of the last finetune step", registry=r)
        self.finetune_state = Gauge("harvest_finetune_state", "1 for the finetune job's current state",
                                    ["state"], registry=r)
        self.finetune_window = Gauge("harvest_finetune_window_layers", "Resident frozen-weight layers", registry=r)
        self.base_weights_mode = Gauge("harvest_finetune_base_weights_mode", "1 for the base weights the job "
                                       "computes with: shared (the served model's) or copy", ["mode"], registry=r)
        self.base_weights_bytes_saved = Gauge("harvest_finetune_base_weights_bytes_saved", "Frozen-weight bytes "
                                              "the job holds no copy of (shared mode)", registry=r)
        self.split_sms = Gauge("harvest_split_sms", "SMs given to each task by the last decision", ["task"],
                               registry=r)
        self.published_version = Gauge("harvest_published_version", "Version of the adapter being trained that "
                                       "this worker serves (0: none yet)", registry=r)
        self.published_step = Gauge("harvest_published_step", "Optimizer step of the served version", registry=r)
        self.publish_cost = Gauge("harvest_publish_cost_seconds", "Scheduler-thread time of the last publish",
                                  ["part"], registry=r)
        self.job_tokens = Gauge("harvest_job_tokens", "Tokens a job has trained", ["job"], registry=r)
        self.job_slack = Gauge("harvest_job_slack_seconds", "Seconds a job's deadline has to spare at the measured "
                               "harvest rate (jobs with a deadline)", ["job"], registry=r)
        self.job_finish = Gauge("harvest_job_predicted_finish_timestamp_seconds", "When a job would finish at the "
                                "measured harvest rate (UNIX time)", ["job"], registry=r)
        self.job_state = Gauge("harvest_job_state", "1 for a job's state in the job set", ["job", "state"],
                               registry=r)
        self.job_published_version = Gauge("harvest_job_published_version", "Version of a job's adapter this "
                                           "worker serves (0: none yet)", ["job"], registry=r)
        self.fleet_round = Gauge("harvest_fleet_round", "The fleet's committed rounds as this worker last applied "
                                 "them (its adapter's version)", registry=r)
        self.fleet_members = Gauge("harvest_fleet_members", "Members of the last round", registry=r)
        self.fleet_tokens = Gauge("harvest_fleet_tokens_contributed", "Tokens this worker's committed rounds "
                                  "carried", registry=r)
        self.fleet_sync = Gauge("harvest_fleet_sync_seconds_total", "Round communication time on the fleet "
                                "thread", registry=r)
        self.fleet_staleness = Gauge("harvest_fleet_staleness_steps", "Optimizer steps trained while the last "
                                     "round was in flight", registry=r)
        self.allocator = AllocatorMetrics(r)

    def record_step(self, step: DecodeStep) -> None:
        self.decode_steps.inc()
        self.decode_tokens.inc(step.batch_size)
        self.step_latency.observe(step.latency_ms / 1e3)
        self.batch_size.set(step.batch_size)
        self.finetune_tokens.inc(step.finetune_tokens)
        if step.is_slo_met is False:
            self.slo_violations.inc()

    def record_finetune(self, job_stats: dict, controller_stats: dict) -> None:
        for state in FINETUNE_STATES:
            self.finetune_state.labels(state).set(1 if job_stats["state"] == state else 0)
        self.finetune_step.set(job_stats.get("step") or 0)
        if job_stats.get("loss") is not None:
            self.finetune_loss.set(job_stats["loss"])
        if job_stats.get("window") is not None:
            self.finetune_window.set(job_stats["window"])
        base_weights = job_stats.get("base_weights")
        if base_weights is not None:
            for mode in ("shared", "copy"):
                self.base_weights_mode.labels(mode).set(1 if base_weights["mode"] == mode else 0)
            self.base_weights_bytes_saved.set(base_weights["bytes_saved"])
        published = job_stats.get("published")
        if published is not None:
            self.published_version.set(published["version"])
            self.published_step.set(published["step"] or 0)
            for part in ("snapshot_ms", "load_ms"):
                if published[part] is not None:
                    self.publish_cost.labels(part.removesuffix("_ms")).set(published[part] / 1e3)
        fleet = job_stats.get("fleet")
        if fleet is not None:
            self.fleet_round.set(fleet["round"])
            self.fleet_members.set(fleet["members"])
            self.fleet_tokens.set(fleet["tokens_contributed"])
            self.fleet_sync.set(fleet["sync_ms_total"] / 1e3)
            self.fleet_staleness.set(fleet["staleness"])
        split = controller_stats.get("split")
        if split is not None:
            self.split_sms.labels("decode").set(split["infer_sms"])
            self.split_sms.labels("finetune").set(split["ft_sms"])

    def record_jobs(self, jobs: list[dict]) -> None:
        """Each job of the set (harvest.jobs.worker_jobs.WorkerJobs.list), labelled by its name."""
        for job in jobs:
            name = job["name"]
            self.job_tokens.labels(name).set(job["tokens"])
            for state in JOB_STATES:
                self.job_state.labels(name, state).set(1 if job["state"] == state else 0)
            if job["slack_s"] is not None:
                self.job_slack.labels(name).set(job["slack_s"])
            if job["predicted_finish_s"] is not None:
                self.job_finish.labels(name).set(job["predicted_finish_s"])
            published = job["finetune"].get("published")
            if published is not None:
                self.job_published_version.labels(name).set(published["version"])

    def record_memory(self, lender_stats: dict) -> None:
        self.allocator.update(lender_stats)

    def render(self) -> bytes:
        return generate_latest(self.registry)
