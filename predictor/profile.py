"""A device's latency profile: the fitted model plus where it came from, as one validated JSON file."""

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from base.errors import HarvestError
from predictor.config import DEFAULT_CONFIG, PredictorConfig
from predictor.finetune_throughput import FinetuneThroughput
from predictor.fit_metrics import FitMetrics
from predictor.json_reader import JsonReader
from predictor.latency_model import LatencyModel
from predictor.partition_grid import PartitionGrid
from predictor.samples import Sample


@dataclass(frozen=True, slots=True)
class SamplesSource:
    path: str
    sha256: str
    num_samples: int


@dataclass(frozen=True, slots=True)
class Profile:
    SCHEMA_VERSION: ClassVar[int] = 1

    device_name: str
    """As the device reports it (`torch.cuda.get_device_name()`, or the CPU model)."""
    grid: PartitionGrid
    model: str
    """The served model (HF id or path)."""
    finetune_config_id: str
    """Which finetune job co-ran (its LlamaFactory config name or hash)."""
    created_utc: str
    samples_source: SamplesSource
    latency_model: LatencyModel
    solo_fit_metrics: FitMetrics
    """Error on the solo samples the model was fitted to."""
    colo_fit_metrics: FitMetrics
    held_out_metrics: tuple[FitMetrics, FitMetrics] | None = None
    """(solo, co-run) error on samples kept out of the fit, when the profiler measured some."""
    finetune_throughput: tuple[FinetuneThroughput, ...] = ()
    partitions: tuple[tuple[int, int], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", tuple(self.latency_model.partitions()))
        ft_sms = [t.ft_sms for t in self.finetune_throughput]
        if len(set(ft_sms)) != len(ft_sms):
            raise HarvestError(f"finetune throughput lists an ft_sms twice: {ft_sms}")
        for sms in ft_sms:
            if sms > self.grid.num_sms:
                raise HarvestError(f"finetune throughput at {sms} SMs exceeds the device's {self.grid.num_sms}")

    @property
    def num_sms(self) -> int:
        return self.grid.num_sms

    @property
    def is_cpu(self) -> bool:
        """Measured on a CPU host (`harvest profile`): its "SMs" are cores, its partitions core sets."""
        return self.device_name.startswith("CPU")

    @property
    def sm_granularity(self) -> int:
        return self.grid.sm_granularity

    @classmethod
    def build(
        cls,
        samples: list[Sample],
        grid: PartitionGrid,
        *,
        device_name: str,
        model: str,
        finetune_config_id: str,
        samples_path: str | Path,
        held_out: list[Sample] | None = None,
        finetune_throughput: tuple[FinetuneThroughput, ...] = (),
        config: PredictorConfig = DEFAULT_CONFIG,
    ) -> "Profile":
        latency_model = LatencyModel.fit(samples, grid, config)
        solo, colo = latency_model.score(samples)
        path = Path(samples_path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        return cls(
            device_name,
            grid,
            model,
            finetune_config_id,
            datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            SamplesSource(str(path), digest, len(samples)),
            latency_model,
            solo,
            colo,
            None if held_out is None else latency_model.score(held_out),
            tuple(finetune_throughput),
        )

    def to_dict(self) -> dict:
        return {
            "schema_version": self.SCHEMA_VERSION,
            "device": {
                "name": self.device_name,
                "num_sms": self.grid.num_sms,
                "sm_granularity": self.grid.sm_granularity,
            },
            "model": self.model,
            "finetune_config_id": self.finetune_config_id,
            "created_utc": self.created_utc,
            "samples": {
                "path": self.samples_source.path,
                "sha256": self.samples_source.sha256,
                "num_samples": self.samples_source.num_samples,
            },
            "partitions": [list(p) for p in self.partitions],
            "latency_model": self.latency_model.to_dict(),
            "fit_metrics": {
                "solo": self.solo_fit_metrics.to_dict(),
                "colo": self.colo_fit_metrics.to_dict(),
                "held_out": None
                if self.held_out_metrics is None
                else {"solo": self.held_out_metrics[0].to_dict(), "colo": self.held_out_metrics[1].to_dict()},
            },
            "finetune_throughput": [t.to_dict() for t in self.finetune_throughput] or None,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise HarvestError(f"cannot read profile {path}: {e.strerror or e}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HarvestError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: object, source: str = "profile") -> "Profile":
        r = JsonReader(data, "", source)
        version = r.integer("schema_version")
        if version != cls.SCHEMA_VERSION:
            raise r.fail("schema_version", f"is {version}; this harvest reads version {cls.SCHEMA_VERSION}")
        device = r.child("device")
        try:
            grid = PartitionGrid(device.integer("num_sms", 1), device.integer("sm_granularity", 1))
        except HarvestError as e:
            raise HarvestError(f"{source}: device: {e}") from None
        samples = r.child("samples")
        metrics = r.child("fit_metrics")
        held_out = (
            (
                FitMetrics.from_dict(metrics.child("held_out").child("solo")),
                FitMetrics.from_dict(metrics.child("held_out").child("colo")),
            )
            if metrics.has("held_out")
            else None
        )
        throughput = (
            tuple(FinetuneThroughput.from_dict(t) for t in r.children("finetune_throughput"))
            if r.has("finetune_throughput")
            else ()
        )
        try:
            profile = cls(
                device.text("name"),
                grid,
                r.text("model"),
                r.text("finetune_config_id"),
                r.text("created_utc"),
                SamplesSource(samples.text("path"), str(samples.raw("sha256")), samples.integer("num_samples", 0)),
                LatencyModel.from_dict(r.child("latency_model"), grid),
                FitMetrics.from_dict(metrics.child("solo")),
                FitMetrics.from_dict(metrics.child("colo")),
                held_out,
                throughput,
            )
        except HarvestError as e:
            if str(e).startswith(source):
                raise
            raise HarvestError(f"{source}: {e}") from None
        stored = [tuple(p) if isinstance(p, list) else p for p in r.array("partitions")]
        if stored != list(profile.partitions):
            raise r.fail(
                "partitions",
                f"do not match the device grid and the fitted model: expected {len(profile.partitions)} "
                f"partitions starting {list(profile.partitions)[:3]}, got {len(stored)} starting {stored[:3]}",
            )
        return profile
