"""The harvest side of a decode worker: sees every decode step, runs the co-located finetune job in
what the step leaves, keeps stats, serves the admin API.

Lives in SGLang's scheduler process; `harvest.sglang.hooks` calls it, with SGLang's objects already
reduced to a `DecodeStep`, so nothing here depends on SGLang.

Deferred imports: the fleet's member (safetensors, and torchft once a job joins) only when a job joins a fleet.
"""

import contextlib
import dataclasses
import functools
import logging
import math
import re
import time
from collections import defaultdict
from pathlib import Path

import psutil
import torch
import yaml

from base.errors import HarvestError
from harvest.admin.admin_app import AdminServer
from harvest.admin.metrics import HarvestMetrics
from harvest.colocation import FinetuneJob, TemporalController
from harvest.colocation.controller import unit_bound_ms
from harvest.colocation.core_partitions import CorePartitions
from harvest.colocation.green_partitions import GreenPartitions
from harvest.colocation.kv_lender import KvLender
from harvest.colocation.spatial_controller import SpatialController
from harvest.colocation.split_chooser import WHOLE, SplitChooser, even_split
from harvest.config import DEFAULT_GRAPH_SETS, Colocation, ServeConfig, colocation_mode
from harvest.finetune.publishing import split_harvest_keys
from harvest.jobs import JobSet
from harvest.jobs.job_intake import JobIntake
from harvest.jobs.job_memory import check_fits
from harvest.jobs.job_spec import NAME_PATTERN
from harvest.jobs.job_store import JobStore
from harvest.jobs.worker_jobs import WorkerJobs
from harvest.step_stats import DecodeStep, SloTracker, StepStats
from predictor import Profile, SplitPlanner

IDLE_WAIT_MS = 20.0
"""The longest an idle worker waits for a request (off the interpreter lock) before the job's next idle turn: a
job that was built or resumed meanwhile starts that much late."""
FETCH_WAIT_MS = 1.0
"""The same while the next unit's layer is fetched (a copy of a millisecond or so on a GPU)."""
FLEET_BUILD_S = 600.0
"""The longest a fleet worker's start waits for its job's engine to be built, before the join's own timeout."""

logger = logging.getLogger(__name__)


class HarvestRuntime:
    def __init__(self, config: ServeConfig):
        self.config = config
        self.profile = _load_profile(config)
        self.colocation = colocation_mode(config, self.profile)
        self.stats = StepStats(config.stats_window_steps)
        self.metrics = HarvestMetrics()
        self.controller = None
        self.lender = None
        self.partitions = None
        self.stream_groups_note = "none (decode on SGLang's own streams, the whole device)"
        self.stream_groups = None
        """The decode graph sets per partition stream (harvest.sglang.hooks sets it on a spatial GPU worker)."""
        self.kv_lending_note = "off (no --finetune)" if config.finetune is None else "off (--no-kv-lending)"
        self._running: dict[int, DecodeStep] = {}
        self._admin_server = None
        self.jobs = None
        """The worker's job set (harvest.jobs.worker_jobs.WorkerJobs), built at start on a finetuning worker."""
        self._fleet_job = None
        """The name of the job that trains with the fleet (--fleet): the --finetune job."""
        self.adapter_target = None
        """Where a job publishes its adapter (harvest.sglang.adapter_publisher.AdapterTarget; hooks sets it)."""
        self.served_weights = None
        """The served model's resident weights (harvest.sglang.hooks sets it): a job on the same model
        computes on them in place."""

    @property
    def is_spatial(self) -> bool:
        return self.colocation is Colocation.SPATIAL

    @property
    def job(self):
        """The one job the controller drives: the job set."""
        return None if self.controller is None else self.controller.job

    @property
    def wants_kv_lending(self) -> bool:
        """Lend free KV memory to the job, in either mode: the lender runs in the scheduler thread while it
        owns the job (spatial_controller.py: at a unit boundary, the unit thread stopping there when asked)."""
        return self.config.finetune is not None and self.config.kv_lending

    def attach_kv_pool(self, allocator) -> None:
        """SGLang's KV pool was built over the unified allocator (harvest.sglang.hooks): lend from it."""
        self.lender = KvLender(allocator)
        self.kv_lending_note = "on"

    def refuse_kv_lending(self, reason: str) -> None:
        self.kv_lending_note = f"off ({reason})"

    def spatial_partitions(self, device_index: int):
        """Spatial mode: the worker's partitions, built once: SM partitions on green contexts on a GPU (contexts
        made as asked: prepare_co_run_contexts, stream groups), core sets on a CPU host; None in temporal mode."""
        if not self.is_spatial:
            return None
        if self.partitions is None:
            self.partitions = _spatial_partitions(self.config, self.profile, device_index)
        return self.partitions

    def green_partitions(self, device_index: int):
        """The SM partitions of a spatial worker on a GPU (None on a CPU host or in temporal mode)."""
        partitions = self.spatial_partitions(device_index)
        return partitions if partitions is not None and self.config.finetune.device.startswith("cuda") else None

    def graph_plan(self, partitions, capture_bs: list[int]) -> tuple[list[tuple[int, int]], int | None]:
        """(the partitions whose decode may get a graph set besides the pinned one, most wanted first; the
        largest batch their sets hold, None: every one of capture_bs, SGLang's). With a profile: those the
        planner co-runs on most over capture_bs and three KV lengths, then the rest it may pick, up to the
        largest batch it co-runs at on the first --partition-graph-sets of them (or --partition-graph-max-bs).
        Without a profile: the split chosen live (splits_to_choose), every batch size; a pinned worker none
        besides the pinned one, unless --partition-graph-sets names how many (profiling: every partition it will
        pin through the admin API, so its visits replay graphs)."""
        config = self.config
        if self.profile is None:
            if config.partition_graph_sets:
                return partitions.pairs, config.partition_graph_max_bs
            pairs = [] if config.pinned_partition is not None else splits_to_choose(partitions)
            return pairs, config.partition_graph_max_bs
        planner = _planner(config, self.profile, partitions.pairs)
        co_run_bs = defaultdict(list)                  # decode SMs -> the batches the planner co-runs on them
        for batch_size in capture_bs:
            for seq_len in (128.0, 1024.0, 4096.0):
                decision = planner.plan(batch_size, seq_len, has_ready_work=True)
                if decision.ft_sms:
                    co_run_bs[decision.infer_sms].append(batch_size)
        pairs = sorted(partitions.pairs, key=lambda pair: -len(co_run_bs[pair[0]]))
        if config.partition_graph_max_bs is not None:
            return pairs, config.partition_graph_max_bs
        chosen = list(dict.fromkeys(i for i, _ in pairs))[:self.graph_sets]
        return pairs, max((bs for i in chosen for bs in co_run_bs[i]), default=min(capture_bs))

    @property
    def graph_sets(self) -> int:
        """How many decode partitions may get a graph set (--partition-graph-sets, else DEFAULT_GRAPH_SETS)."""
        sets = self.config.partition_graph_sets
        return DEFAULT_GRAPH_SETS if sets is None else sets

    def planner_pairs(self, partitions) -> list[tuple[int, int]]:
        """The partitions the planner may pick: formed on the device and, where decode replays graphs per
        partition, with a graph set for their decode. The profile was measured on graph replays: a partition
        left without a set (over --partition-graph-sets) decodes eagerly, slower than predicted."""
        if self.stream_groups is None:
            return partitions.pairs
        return [(i, f) for i, f in partitions.pairs if self.stream_groups.has_graphs(i)]

    def prepare_co_run_contexts(self, partitions) -> None:
        """With a profile the planner may pick any of its co-run partitions at any step, and without one the split
        chosen live may start at any phase: their green contexts are made at start-up. A profiling worker makes a
        finetune context at its first pin instead (~136 on an H100), in the visit's warm-up."""
        if not hasattr(partitions, "prepare"):
            return
        if self.profile is not None:
            partitions.prepare([(i, f) for i, f in self.planner_pairs(partitions) if f > 0])
        elif self.config.pinned_partition is None:
            partitions.prepare(splits_to_choose(partitions))

    def start(self, serve_admin: bool, device_index: int, max_running_requests: float) -> None:
        """The scheduler is built: build the controller, start the finetune job's construction and the admin API.
        device_index: the worker's CUDA device (SGLang's gpu_id); max_running_requests: its cap on the batch."""
        if self.config.finetune is not None:
            partitions = self.spatial_partitions(device_index)
            if partitions is not None:
                self.prepare_co_run_contexts(partitions)
            planner = _planner(self.config, self.profile,
                               None if partitions is None else self.planner_pairs(partitions))
            self.controller = _build_controller(self.config, self.profile, planner, partitions, self.lender,
                                                JobSet(fair_share_quantum_ms=self.config.job_quantum_s * 1e3),
                                                max_running_requests)
            self.jobs = self._worker_jobs(_job_config(self.config, planner, device_index, partitions))
            initial = _initial_job(self.config.finetune)
            self._fleet_job = None if self.config.fleet is None else initial["name"]
            self.jobs.start(initial)
            if self._fleet_job is not None:
                self._wait_joined(self.jobs.job_set.members[self._fleet_job].job)
        if serve_admin:
            self._admin_server = AdminServer(self, self.config.admin)
            self._admin_server.start()

    def _worker_jobs(self, job_config):
        """The job set's intake and store, in the jobs directory (--jobs-dir, or the supervisor's own)."""
        if self.config.jobs_dir is None:
            raise HarvestError("a worker that takes jobs needs a jobs directory: `harvest serve` makes one "
                               "without --jobs-dir")
        return WorkerJobs(JobIntake(self.job, JobStore(self.config.jobs_dir), job_config, self._make_job,
                                    self._check_fit))

    def _make_job(self, spec, job_config):
        """The FinetuneJob of an admitted job, its engine building in the background, publishing under its
        adapter name where it publishes; the --fleet job trains its data shard and joins the fleet once built."""
        fleet_join = None
        if spec.name == self._fleet_job:
            from harvest.fleet.fleet_member import join_fleet

            job_config = dataclasses.replace(job_config, data_shard=self.config.fleet.data_shard)
            fleet_join = functools.partial(join_fleet, config=self.config.fleet)
        job = FinetuneJob(job_config, weight_memory=None if self.lender is None else self.lender.weight_memory,
                          served_weights=self.served_weights, fleet_join=fleet_join)
        if spec.publish_name is not None and self.adapter_target is not None:
            job.publisher = self.adapter_target.publisher(spec.publish_name)
        job.start()
        return job

    def _wait_joined(self, job) -> None:
        """A fleet worker starts only once its job is built and in the fleet: a wrong fleet (another job or base
        model, no quorum in time) fails the start with the reason, not a job that failed inside a running worker."""
        if not job.wait_built(self.config.fleet.timeout_s + FLEET_BUILD_S) or job.fleet is None:
            raise HarvestError(f"--fleet {self.config.fleet.lighthouse}: the job did not join the fleet"
                               + (f": {job.error}" if job.error else f" within {self.config.fleet.timeout_s:.0f} s"))

    def _check_fit(self, spec, llamafactory) -> None:
        """What only this worker knows of a submitted job: its memory floor, and whether SGLang can load its
        adapter (with the LoRA flags it started with)."""
        check_fits(llamafactory, self.config.finetune.served_model_path, _free_bytes(self.config.finetune.device))
        if spec.publish_name is not None and self.adapter_target is not None:
            self.adapter_target.check(llamafactory)

    def stop(self) -> None:
        if self.jobs is not None:
            self.jobs.close()
        if self.controller is not None:
            self.controller.close()
        if self._admin_server is not None:
            self._admin_server.stop()

    @property
    def decode_stream(self):
        """The stream the next decode step launches on: its SM partition's; None for SGLang's own streams."""
        return None if self.controller is None else self.controller.decode_stream

    def decode_stream_context(self):
        """Where the scheduler thread runs the next decode step: its partition's cores on a CPU host (on a GPU
        the step moves by its stream instead, decode_stream)."""
        return contextlib.nullcontext() if self.controller is None else self.controller.decode_stream_context()

    # ---- scheduler thread, once per decode step ----

    def step_launching(self, step: DecodeStep) -> None:
        if self.controller is not None:
            self.controller.before_step(step)

    def step_launched(self, step: DecodeStep) -> None:
        self._running[step.forward_iter] = step

    def step_finished(self, forward_iter: int, kv_demand_slots: int = 0) -> DecodeStep | None:
        """The step's tokens are out. kv_demand_slots: KV slots decode needs before its next step."""
        step = self._running.pop(forward_iter, None)
        if step is None:
            return None
        step.latency_ms = (time.perf_counter() - step.start_s) * 1e3
        if self.controller is not None:
            self.controller.after_step(step, kv_demand_slots)
        self.stats.record(step)
        self.metrics.record_step(step)
        return step

    def adapter_changed(self, verb: str, duration_ms: float, name: str | None = None) -> None:
        """SGLang loaded or unloaded adapter `name` in the scheduler thread: the next decode step waited for it.
        A version is loaded under its adapter's name plus "@" and an id (lora_replace.py) and counted to the job
        that publishes under that name."""
        publisher = None
        if self.jobs is not None and name is not None:
            published_name = name.split("@", 1)[0]
            publisher = next((p for p in self.jobs.publishers().values() if p.name == published_name), None)
        if publisher is not None:
            publisher.note_scheduler_ms(verb, duration_ms)
        if self.controller is not None:
            self.controller.charge_publish_ms(duration_ms)

    def on_idle(self, kv_demand_slots: int = 0) -> float:
        """No decode batch: the job's idle turn. Returns how long the loop may wait for a request before the
        next turn: 0 after a turn that worked for the job (a unit, or a partition taken back: it comes straight
        back for the next), FETCH_WAIT_MS while the next unit's layer is fetched, IDLE_WAIT_MS when nothing the
        job does would make a unit ready sooner (no job, one building, paused, or done)."""
        if self.controller is None:
            return IDLE_WAIT_MS
        self.metrics.finetune_tokens.inc(self.controller.on_idle(kv_demand_slots))
        if self.controller.idle_turn_worked:
            return 0.0
        return FETCH_WAIT_MS if self.jobs.job_set.is_fetching else IDLE_WAIT_MS

    # ---- admin thread ----

    def finetune_action(self, action: str, timeout_s: float = 120.0) -> dict:
        """The /harvest/finetune verbs: pause, resume and publish act on the current job (the one the device
        trains, or trained last: with one job, that job); stop checkpoints every job (shutdown)."""
        member = None if self.jobs is None else self.jobs.current()
        if action == "stop" and self.jobs is not None:
            if not self.jobs.stop_all(timeout_s):
                raise HarvestError(f"the finetune jobs did not checkpoint within {timeout_s:.0f} s")
            return self.jobs.current_stats()
        if member is None:
            raise HarvestError("this worker runs no finetune job (start it with --finetune, or submit one to "
                               "/harvest/jobs)")
        name = member.spec.name
        if action == "pause":
            self.jobs.pause(name)
        elif action == "resume":
            self.jobs.resume(name)
        elif action == "publish":
            return member.job.request_publish(timeout_s)
        return self.jobs.current_stats()

    def pin_partition(self, partition: tuple[int, int] | None) -> dict:
        """Run every step on partition (infer, ft) from the next one; None: the planner chooses again (a
        spatial worker only; unpinning needs its profile)."""
        controller = self.controller
        if controller is None or not self.is_spatial:
            raise HarvestError("only a spatial worker has partitions to pin (--pin-partition or a co-run --profile)")
        if partition is None and controller.planner is None:
            raise HarvestError("this worker has no --profile: nothing would choose the partition if unpinned")
        if partition is not None and not controller.partitions.can_form(*partition):
            raise HarvestError(f"partition {partition} is not one this device forms")
        controller.pinned = partition
        return {"pinned": None if partition is None else list(partition)}

    def stats_snapshot(self, window_steps: int | None = None) -> dict:
        snapshot = {"decode": self.stats.snapshot(window_steps)}
        if self.controller is not None:
            snapshot["finetune"] = self.jobs.current_stats()
            snapshot["jobs"] = self.jobs.stats()
            snapshot["colocation"] = {**self.controller.stats(), "decode_stream_groups": self.stream_groups_note}
            if self.stream_groups is not None:
                snapshot["colocation"]["decode_graph_sets"] = self.stream_groups.stats()
            snapshot["memory"] = {"kv_lending": self.kv_lending_note,
                                  **(self.lender.stats() if self.lender is not None else {})}
        return snapshot

    def steps_since(self, seq: int, limit: int) -> list[dict]:
        return self.stats.steps_since(seq, limit)

    def render_metrics(self) -> bytes:
        self.metrics.uptime.set(time.time() - self.stats.started_s)
        if self.controller is not None:
            self.metrics.record_finetune(self.jobs.current_stats(), self.controller.stats())
            self.metrics.record_jobs(self.jobs.list())
        if self.lender is not None:
            self.metrics.record_memory(self.lender.stats())
        return self.metrics.render()


def _load_profile(config: ServeConfig):
    """The latency profile the planner uses: only with a finetune job and --profile."""
    if config.finetune is None or config.profile_path is None:
        return None
    return Profile.load(config.profile_path)


def _initial_job(finetune_config) -> dict | None:
    """The `--finetune` job as a submission: named after its adapter, else its YAML file."""
    if finetune_config.yaml_path is None:
        return None
    text = Path(finetune_config.yaml_path).read_text()
    publishing = split_harvest_keys(yaml.safe_load(text))[1]
    stem = publishing.name if publishing is not None else Path(finetune_config.yaml_path).stem
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-_")[:63] or "job"
    assert NAME_PATTERN.fullmatch(name), name
    return {"name": name, "yaml_text": text, "resume": finetune_config.resume}


def _free_bytes(device: str) -> int:
    """Memory a new job may take: the device's free memory on a GPU, the host's available memory on a CPU."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return psutil.virtual_memory().available


def _planner(config: ServeConfig, profile, pairs):
    """`pairs`: the partitions a spatial worker forms (None: temporal), whose co-run steps' slices wait for the
    partition's unit in flight, which the planner weighs against each co-run (SplitPlanner.expect_switch)."""
    if profile is None:
        return None
    planner = SplitPlanner(profile, config.tpot_slo_ms, pairs=pairs)
    if pairs is not None:
        planner.expect_switch(_max_unit_ms(config, planner))
    return planner


def _max_unit_ms(config: ServeConfig, planner) -> float:
    if config.finetune is not None and config.finetune.max_unit_ms is not None:
        return config.finetune.max_unit_ms
    return unit_bound_ms(config.tpot_slo_ms, None if planner is None else planner.shortest_step_ms)


def _job_config(config: ServeConfig, planner, device_index: int, partitions):
    """Every job's FinetuneConfig but its YAML. device_index: the worker's CUDA device, named in the job's
    device (a bare "cuda" means device 0 in the spatial unit thread, whatever SGLang set). Called on the
    scheduler thread, whose torch thread count the job's units in decode's turns run with."""
    finetune_config = dataclasses.replace(config.finetune, yaml_path=None, resume=False)
    if finetune_config.device == "cuda":
        finetune_config = dataclasses.replace(finetune_config, device=f"cuda:{device_index}")
    if finetune_config.device == "cpu":
        counts = {torch.get_num_threads()}
        if partitions is not None:
            counts |= {len(partitions.cores)} | {ft for _, ft in partitions.pairs if ft > 0}
        finetune_config = dataclasses.replace(finetune_config, compile_thread_counts=tuple(sorted(counts)))
    return dataclasses.replace(finetune_config, max_unit_ms=_max_unit_ms(config, planner))


def _build_controller(config: ServeConfig, profile, planner, partitions, lender, job,
                      max_running_requests: float = math.inf):
    """Without a profile nothing is predicted: temporal, each step's finetune budget the target minus its own
    measured time, or (spatial) the split each phase runs chosen by what each split trained live
    (SplitChooser). `job`: the job set; `max_running_requests`: the scheduler's cap on the batch."""
    slo = SloTracker(config.tpot_slo_ms, config.stats_window_steps)
    size_co_run_units = config.finetune.max_unit_ms is None  # a bound set by hand holds for every unit
    if planner is None and partitions is None:
        return TemporalController(job, None, slo, "none (no --profile): each step's finetune budget is the target "
                                  "minus its measured time", lender, max_running_requests=max_running_requests)
    if partitions is not None and planner is None and config.pinned_partition is None:
        chooser = SplitChooser(splits_to_choose(partitions))
        splits = ", ".join(f"({i}, {f})" for i, f in chooser.splits[1:])
        return SpatialController(job, None, slo, partitions, "none (no --profile): the split chosen by what each "
                                 f"trains live, phase by phase: the whole device and its slice, or {splits}", lender,
                                 chooser=chooser, size_co_run_units=size_co_run_units,
                                 max_running_requests=max_running_requests)
    source = ("none: --pin-partition" if profile is None
              else f"profile {config.profile_path} ({profile.device_name}), online correction on")
    if partitions is not None:
        return SpatialController(job, planner, slo, partitions, source, lender, config.pinned_partition,
                                 size_co_run_units=size_co_run_units, max_running_requests=max_running_requests)
    return TemporalController(job, planner, slo, source, lender, max_running_requests=max_running_requests)


def splits_to_choose(partitions) -> list[tuple[int, int]]:
    """The finetune partitions a spatial worker without a profile or a pin chooses among, besides the whole
    device: every one a CPU host's cores form; on a GPU the even split alone, since each one's decode needs a
    CUDA graph set captured at start-up and phases of its own to be measured, which the ~120 pairs an H100's
    SMs form would not get."""
    if isinstance(partitions, GreenPartitions):
        split = even_split(partitions.pairs)
        return [] if split is WHOLE else [split]
    return partitions.pairs


def _spatial_partitions(config: ServeConfig, profile, device_index: int):
    """SMs on green contexts on the worker's GPU; core sets on a CPU host. With a profile, its partitions (and
    the pinned one); without one (the split chosen live, or a worker pinned for `harvest profile --co-run`),
    every partition the device forms, since the admin API may pin any of them (POST /harvest/partition)."""
    pairs = None
    if profile is not None:
        pairs = list(profile.partitions)
        if config.pinned_partition is not None and config.pinned_partition not in pairs:
            pairs.append(config.pinned_partition)
    if config.finetune.device.startswith("cuda"):
        partitions = GreenPartitions(device_index, pairs)
        if config.pinned_partition is not None and not partitions.can_form(*config.pinned_partition):
            # Checked here, at start-up: the driver's split is known only on the device (the CPU form is
            # checked before the worker starts, serve.py). Else the first step would find no stream for it.
            raise HarvestError(f"--pin-partition {config.pinned_partition}: the driver split this GPU's "
                               f"{partitions.num_sms} SMs into groups {partitions.group_sms}, which form no such "
                               "partition (decode a prefix of whole groups, finetune the groups right after)")
        return partitions
    return CorePartitions(pairs)
