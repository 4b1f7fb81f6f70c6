"""Simulated replay: every policy on the same trace, costed on the same hardware, into results.json."""

import datetime
import time
from collections.abc import Callable

import numpy as np

from base.errors import HarvestError
from harvest.replay.colocation_policies import POLICY_CLASSES
from harvest.replay.decode_simulator import DecodeSimulator, DeviceRun
from harvest.replay.finetune_rates import FinetuneRates
from harvest.replay.fleet_replay import FleetReplay
from harvest.replay.job_replay import JobReplay
from harvest.replay.policy_summary import SCHEMA_VERSION, summarize_policy
from harvest.replay.recorded_device import Recording
from harvest.replay.replay_config import DeviceMemory, ReplayConfig
from predictor import Profile
from predictor.synthetic_profile import is_synthetic
from traces.trace import Trace

DEDICATED_FINETUNE_DEVICE = {"separate": True, "harvest": True, "temporal": True, "static": False, "oracle": True}
NUM_DECODE_DEVICES = {"separate": 1, "harvest": 1, "temporal": 1, "static": 2, "oracle": 1}

DEVICES = (
    "Each policy has HARLI's two devices (sec. 8.1). `separate` decodes on one and finetunes alone on the "
    "other; `harvest` and `temporal` decode on one, harvesting it, and finetune alone on the other; `static` "
    "splits both 60/40 and sends the requests round-robin to the two (HARLI's StaticMode co-locates on both "
    "GPUs). Finetune tokens/s are the two devices', over the span until the last request finishes, so "
    "`separate`'s is exactly the profile's whole-device solo rate and a ratio to it is HARLI's Fig. 11b."
)
"""How the policies' devices are counted (written into results.json as `devices`)."""


class ReplaySimulation:
    def __init__(self, profile: Profile, memory: DeviceMemory, config: ReplayConfig, profile_path: str = "",
                 recording: Recording | None = None):
        """`recording`: the device's decode and unit times as real workers measured them (recorded_device.py);
        None: the profile's, with config.latency_noise."""
        self.profile, self.memory, self.config, self.profile_path = profile, memory, config, profile_path
        self.recording = recording
        self.rates = FinetuneRates.from_profile(profile)

    def num_device_runs(self) -> int:
        return sum(NUM_DECODE_DEVICES[p] for p in self.config.policies)

    def run(self, trace: Trace, on_progress: Callable[[str, float], None] | None = None,
            jobs: JobReplay | None = None, fleet: FleetReplay | None = None, on_fleet_size=None) -> dict:
        """Simulate every policy; on_progress(policy, simulated seconds done on the current device). `jobs`: a
        job-arrival trace, driven by the harvest policy once per job policy (the "jobs" section). `fleet`: fleets
        of harvest workers (the "fleet" section); on_fleet_size(n, seconds) after each size."""
        self._check_fits(trace)
        started = time.perf_counter()
        entries: dict[str, dict] = {}
        timings: dict[str, float] = {}
        for name in self.config.policies:
            t0 = time.perf_counter()
            try:
                runs = self._run_policy(name, trace, on_progress)
            except HarvestError as e:
                if name != "static" or self.profile.latency_model.has_colo:
                    raise
                entries[name] = {"status": "not_applicable", "reason": str(e)}
                continue
            span_s = max(trace.duration_s, *(r.end_s for r in runs))
            rate = self.rates.whole_device_tokens_per_s if DEDICATED_FINETUNE_DEVICE[name] else 0.0
            c = self.config
            entries[name] = summarize_policy(
                name,
                runs,
                rate,
                span_s,
                self.memory.kv_bytes_per_token,
                c.tpot_slo_ms,
                self.rates.samples_per_token,
                c.num_series_points,
            )
            if name == "static":
                entries[name]["split"] = {
                    "infer_sms": int(runs[0].step_infer_sms.max(initial=0)),
                    "ft_sms": int(runs[0].step_ft_sms.max(initial=0)),
                }
            timings[name] = round(time.perf_counter() - t0, 3)
        oracle_rate = entries.get("oracle", {}).get("finetune", {}).get("decode_device_tokens_per_s")
        for entry in entries.values():
            if oracle_rate and entry["status"] == "ok":
                entry["finetune"]["decode_device_ratio_to_oracle"] = entry["finetune"]["decode_device_tokens_per_s"] / oracle_rate
        for base in ("separate", "static"):
            base_rate = entries.get(base, {}).get("finetune", {}).get("tokens_per_s")
            for entry in entries.values():
                if base_rate and entry["status"] == "ok":
                    entry["finetune"][f"ratio_to_{base}"] = entry["finetune"]["tokens_per_s"] / base_rate
        jobs_entry = None
        if jobs is not None:
            t0 = time.perf_counter()
            jobs_entry = jobs.run(self, trace, entries["harvest"]["finetune"]["decode_device_tokens_per_s"])
            timings["jobs"] = round(time.perf_counter() - t0, 3)
        fleet_entry = None
        if fleet is not None:
            t0 = time.perf_counter()
            fleet_entry = fleet.run(self, trace, entries["harvest"]["finetune"]["decode_device_tokens_per_s"],
                                    on_fleet_size)
            timings["fleet"] = round(time.perf_counter() - t0, 3)
        return {
            "schema_version": SCHEMA_VERSION,
            "mode": "simulated",
            "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "trace": trace.summary(),
            "profile": self.profile_info(),
            "memory": {
                "preset": self.memory.name,
                "kv_capacity_tokens": self.memory.kv_capacity_tokens,
                "kv_bytes_per_token": self.memory.kv_bytes_per_token,
                "kv_pool_bytes": self.memory.pool_bytes,
                "ft_layer_bytes": self.memory.ft_layer_bytes,
                "ft_num_layers": self.memory.ft_num_layers,
                "ft_resident_bytes": self.memory.ft_resident_bytes,
            },
            "config": {
                "tpot_slo_ms": self.config.tpot_slo_ms,
                "static_infer_share": self.config.static_infer_share,
                "max_running_requests": self.config.max_running_requests,
                "latency_noise": self.config.latency_noise,
                "plan_margin": self.config.plan_margin,
                "seed": self.config.seed,
                "recording": None if self.recording is None else self.recording.name,
            },
            "devices": DEVICES,
            "notes": self.notes(),
            "policies": entries,
            **({} if jobs_entry is None else {"jobs": jobs_entry}),
            **({} if fleet_entry is None else {"fleet": fleet_entry}),
            "simulation_s": {"total": round(time.perf_counter() - started, 3), **timings},
        }

    def _check_fits(self, trace: Trace) -> None:
        """Fail before simulating anything if some policy's KV pool cannot hold the longest request."""
        need = trace.context_tokens + trace.generated_tokens
        longest = int(np.argmax(need))
        is_static_run = "static" in self.config.policies and self.profile.latency_model.has_colo
        share = self.config.static_infer_share if is_static_run else 1.0
        pool = int(self.memory.kv_capacity_tokens * share)
        if need[longest] > pool:
            raise HarvestError(
                f"request {longest} of {trace.name} needs {int(need[longest])} KV tokens but the pool holds {pool}"
                f"{' (static keeps ' + format(share, '.0%') + ')' if share < 1 else ''}: cap lengths "
                "(--max-context-tokens) or raise --kv-capacity-tokens"
            )

    def _run_policy(self, name: str, trace: Trace, on_progress) -> list[DeviceRun]:
        num_devices = NUM_DECODE_DEVICES[name]
        runs = []
        for device in range(num_devices):
            policy = POLICY_CLASSES[name](self.profile, self.memory, self.rates, self.config, self.recording)
            report = None if on_progress is None else (lambda t, name=name: on_progress(name, t))
            ids = np.arange(device, trace.num_requests, num_devices)
            runs.append(DecodeSimulator(policy, report).run(trace, ids))
        return runs

    def profile_info(self) -> dict:
        p = self.profile
        return {
            "path": self.profile_path,
            "device": p.device_name,
            "is_synthetic": is_synthetic(p),
            "created_utc": p.created_utc,
            "model": p.model,
            "num_sms": p.num_sms,
            "num_partitions": len(p.partitions),
            "has_co_run_model": p.latency_model.has_colo,
            "whole_device_finetune_tokens_per_s": self.rates.whole_device_tokens_per_s,
        }

    def notes(self) -> list[str]:
        notes = []
        if is_synthetic(self.profile):
            notes.append(
                f"SYNTHETIC profile ({self.profile.device_name}): every number here is computed from "
                "made-up device numbers, not from a measured GPU"
            )
        if not self.profile.latency_model.has_colo:
            notes.append(
                "the profile has one partition (no co-run model): static is not defined, and harvest "
                "reduces to temporal sharing: a slice after each step, sized on its measured time"
            )
        if self.rates.samples_per_token is None:
            notes.append("samples/s not reported: the profile recorded no measured samples/s (samples_per_s_solo)")
        if self.recording is not None:
            notes.append(f"the simulated device's decode and unit times are recorded ones ({self.recording.name}), "
                         "scaled to each step's shape by the profile")
        elif self.config.latency_noise == 0:
            notes.append("the simulated device follows the profile exactly (latency_noise 0)")
        return notes
