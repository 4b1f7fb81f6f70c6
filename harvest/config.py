"""Configuration of one `harvest serve` worker: parsed once at the CLI edge, read-only afterwards."""

import enum
import ipaddress
import os
from dataclasses import dataclass

from base.errors import HarvestError
from harvest.finetune.finetune_config import FinetuneConfig
from harvest.fleet.fleet_config import FleetConfig


class Colocation(enum.Enum):
    """How the finetune job shares the device with decode (`--colocation`)."""

    TEMPORAL = "temporal"
    """Between decode steps, on the whole device, in the slack each step leaves under the TPOT target."""
    SPATIAL = "spatial"
    """Beside decode on a partition of the device (SMs of a GPU, cores of a CPU host)."""
    OFF = "off"
    """No finetune job: serve only."""


@dataclass(frozen=True, slots=True)
class AdminConfig:
    host: str = "127.0.0.1"
    """Address the admin HTTP server binds; a non-loopback address requires `token`."""
    port: int = 30100
    """Port of the admin HTTP server (separate from SGLang's own port)."""
    token: str | None = None
    """Bearer token required by mutating admin endpoints; None leaves them open (loopback only)."""

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise HarvestError(f"--admin-port {self.port} is not a TCP port (1-65535)")
        if self.token is not None and not self.token.strip():
            raise HarvestError("--admin-token is empty: an empty token would leave the admin API open")
        if self.token is not None and self.token != self.token.strip():
            raise HarvestError("--admin-token starts or ends with whitespace, which no HTTP header can carry")
        if self.token is None and not is_loopback(self.host):
            raise HarvestError(
                f"--admin-host {self.host} is reachable from other machines: set --admin-token too"
            )


DEFAULT_GRAPH_SETS = 4
"""Decode partitions given a CUDA graph set of their own on a worker with a profile (--partition-graph-sets)."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    admin: AdminConfig
    stats_window_steps: int = 1000
    """Decode steps in the sliding window behind latency percentiles and SLO attainment."""
    finetune: FinetuneConfig | None = None
    """What every co-located job runs with (device, unit bound, window): set where the worker finetunes
    (`--tpot-slo-ms`), its yaml_path the job submitted at start (`--finetune CFG.yaml`, else None: jobs come
    through the admin API); None serves only."""
    fleet: FleetConfig | None = None
    """The fleet the `--finetune` job trains with (`--fleet`); None: it trains alone."""
    job_quantum_s: float = 30.0
    """Unit time a job trains before another of equal standing takes its turn (`--job-quantum-s`): each switch
    re-fetches the incoming job's window, so a turn must be long against that."""
    jobs_dir: str | None = None
    """Where the worker's job set lives on disk (`--jobs-dir`), so a restarted worker resumes it; None:
    `harvest serve`'s supervisor makes one for the worker's life, which a restart does not find."""
    tpot_slo_ms: float | None = None
    """Decode latency target per step (`--tpot-slo-ms`); required with a finetune job."""
    profile_path: str | None = None
    """Latency profile (`--profile`) for the split planner; None: conservative start, online correction."""
    kv_lending: bool = True
    """Lend free KV-cache chunks to the finetune job's weight window (`--no-kv-lending` turns it off)."""
    kv_block_kib: int = 2048
    """Mapping granularity of the KV pool (`--kv-block-kib`): 2 MiB on CUDA; host pages allow smaller."""
    pinned_partition: tuple[int, int] | None = None
    """Spatial co-location on this one (infer, ft) partition every step, no planner (`--pin-partition`)."""
    partition_graph_sets: int | None = None
    """Decode partitions that get a CUDA graph set of their own besides the whole device's
    (`--partition-graph-sets`): each set costs capture time and graph memory; the planner picks only these.
    None: DEFAULT_GRAPH_SETS with a profile; without one the pinned partition's, or the split chosen live
    against the whole device (runtime.splits_to_choose). Given without a profile
    (`harvest profile --co-run`), that many partitions get one, so a partition pinned later through the admin
    API replays graphs as a served step does, not eager kernels."""
    partition_graph_max_bs: int | None = None
    """Largest batch captured on a partition's graph set (`--partition-graph-max-bs`); a larger batch on a
    partition decodes eagerly on its stream. None: the largest the planner co-runs at (every size without a
    profile, on the one pinned partition)."""
    colocation: Colocation | None = None
    """The co-location mode asked for (`--colocation`); None: inferred (colocation_mode)."""
    publish_to: tuple[str, ...] = ()
    """Further SGLang workers that load every published version (`--publish-to URL`): a PD deployment's
    prefill workers, which compute the prompts of requests naming the adapter."""

    def __post_init__(self):
        if self.stats_window_steps < 1:
            raise HarvestError(f"stats window must hold at least one step, got {self.stats_window_steps}")
        if self.finetune is not None and self.tpot_slo_ms is None:
            raise HarvestError("--finetune needs --tpot-slo-ms: the decode latency target finetuning must respect")
        if self.fleet is not None and (self.finetune is None or self.finetune.yaml_path is None):
            raise HarvestError("--fleet needs --finetune: the job the fleet trains")
        if not self.job_quantum_s > 0:
            raise HarvestError(f"--job-quantum-s must be > 0, got {self.job_quantum_s}")
        if self.jobs_dir is not None and self.finetune is None:
            raise HarvestError("--jobs-dir needs --tpot-slo-ms: a worker without a decode target takes no jobs")
        if self.tpot_slo_ms is not None and not self.tpot_slo_ms > 0:
            raise HarvestError(f"--tpot-slo-ms must be > 0, got {self.tpot_slo_ms}")
        if self.profile_path is not None and self.tpot_slo_ms is None:
            raise HarvestError("--profile needs --tpot-slo-ms")
        if self.pinned_partition is not None:
            if self.finetune is None:
                raise HarvestError("--pin-partition needs --tpot-slo-ms (a worker that finetunes): it says where the "
                                   "finetune job co-runs")
            infer, ft = self.pinned_partition
            if infer < 1 or ft < 0:
                raise HarvestError(f"--pin-partition needs INFER >= 1 and FT >= 0, got {infer},{ft}")
        self._check_colocation()
        if self.partition_graph_sets is not None and self.partition_graph_sets < 0:
            raise HarvestError(f"--partition-graph-sets must be >= 0, got {self.partition_graph_sets}")
        if self.partition_graph_max_bs is not None and self.partition_graph_max_bs < 1:
            raise HarvestError(f"--partition-graph-max-bs must be >= 1, got {self.partition_graph_max_bs}")
        if self.publish_to and self.finetune is None:
            raise HarvestError("--publish-to needs --tpot-slo-ms (a worker that finetunes): it says where the jobs' "
                           "adapters are published")
        for url in self.publish_to:
            if not url.startswith(("http://", "https://")):
                raise HarvestError(f"--publish-to {url!r} is not an http(s) URL of an SGLang worker")
        if self.kv_block_kib < 4 or self.kv_block_kib & (self.kv_block_kib - 1):
            raise HarvestError(f"--kv-block-kib must be a power of two >= 4 (host pages), got {self.kv_block_kib}")

    def _check_colocation(self) -> None:
        if self.colocation is None:
            return
        flag = f"--colocation {self.colocation.value}"
        if self.colocation is Colocation.OFF:
            if self.finetune is not None:
                raise HarvestError(f"{flag} serves only: drop --finetune, or pick temporal or spatial")
            return
        if self.finetune is None:
            raise HarvestError(f"{flag} needs --tpot-slo-ms: the decode target the co-located jobs run under")
        if self.colocation is Colocation.TEMPORAL and self.pinned_partition is not None:
            raise HarvestError(f"{flag} runs on the whole device: --pin-partition is spatial")
        if (self.colocation is Colocation.SPATIAL and self.pinned_partition is None and self.profile_path is None
                and not can_choose_split(self.finetune)):
            raise HarvestError(f"{flag} on a one-core host needs --pin-partition or a --profile with co-run "
                               "partitions (a GPU, or a host of two or more cores, chooses its split itself)")


def can_choose_split(finetune: FinetuneConfig) -> bool:
    """A spatial worker without a profile or a pinned partition chooses its split from what each trains live
    (split_chooser.py): on a GPU (its SMs on green contexts), or on a CPU host of two or more cores."""
    return finetune.device.startswith("cuda") or len(os.sched_getaffinity(0)) >= 2


def colocation_mode(config: ServeConfig, profile) -> Colocation:
    """The worker's co-location mode, decided here only. Unless --colocation names it: spatial where
    --pin-partition names a partition or the profile has co-run partitions (SMs of a GPU, or cores of the CPU
    host it was measured on), or where there is no profile on a GPU or a CPU host of two or more cores (the split
    chosen live, split_chooser.py); else temporal; off without a finetune job."""
    if config.finetune is None:
        return Colocation.OFF
    has_co_run = profile is not None and profile.latency_model.has_colo and (
        config.finetune.device.startswith("cuda") or profile.is_cpu)
    chooses_split = profile is None and can_choose_split(config.finetune)
    if (config.colocation is Colocation.SPATIAL and config.pinned_partition is None and not has_co_run
            and not chooses_split):
        raise HarvestError("--colocation spatial: the --profile has no co-run partitions for this device to plan "
                           "with (measure them with `harvest profile`, or give --pin-partition)")
    if config.colocation is not None:
        return config.colocation
    if config.pinned_partition is not None or has_co_run or chooses_split:
        return Colocation.SPATIAL
    return Colocation.TEMPORAL


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
