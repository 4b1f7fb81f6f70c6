"""A SYNTHETIC H100 profile for the simulator's tests, the default demo and `harvest bench predictor`: no GPU
has been measured.

Decode latency is predictor.SyntheticDevice (Llama3-8B-on-H100-like: eq. 2 and 3 plus 2 % noise),
sampled on the profiler's own SamplingPlan and fitted by the real predictor. Finetune speed is made up
to the same scale: LoRA on Llama3-8B at ~3000 tokens/s on the whole device, sublinear in SMs (exponent
0.8), 20 % slower beside decode, 10 ms units (HARLI 6.1). The device name says `synthetic` so no number
computed from it can pass for a measurement.

Regenerate the shipped file: `python -m predictor.synthetic_profile`.
"""

from pathlib import Path

from predictor.finetune_throughput import FinetuneThroughput
from predictor.partition_grid import PartitionGrid
from predictor.profile import Profile
from predictor.sampling_plan import SamplingPlan
from predictor.synthetic_device import SyntheticDevice

SYNTHETIC_DEVICE_NAME = "synthetic-h100 (made-up numbers, not measured)"
SHIPPED_PATH = Path(__file__).with_name("profiles") / "synthetic-h100-llama3-8b.json"
WHOLE_DEVICE_TOKENS_PER_S = 3000.0
SM_EXPONENT = 0.8
COLO_FACTOR = 0.8
UNIT_MS = 10.0


def synthetic_finetune_throughput(grid: PartitionGrid) -> tuple[FinetuneThroughput, ...]:
    shares = sorted({f for _, f in grid.pairs()} | {grid.num_sms})
    return tuple(
        FinetuneThroughput(
            f,
            WHOLE_DEVICE_TOKENS_PER_S * grid.ratio(f) ** SM_EXPONENT,
            COLO_FACTOR * WHOLE_DEVICE_TOKENS_PER_S * grid.ratio(f) ** SM_EXPONENT,
            UNIT_MS,
        )
        for f in shares
    )


def build_synthetic_profile(seed: int = 0, max_batch_size: int = 256, max_seq_len: int = 8192) -> Profile:
    grid = PartitionGrid.from_name("h100")
    plan = SamplingPlan(grid, max_batch_size, max_seq_len, seed=seed)
    device = SyntheticDevice(grid)
    return Profile.build(
        device.measure(plan.fit_points, seed),
        grid,
        device_name=SYNTHETIC_DEVICE_NAME,
        model="synthetic Llama3-8B-like decode latency",
        finetune_config_id="synthetic LoRA finetune throughput",
        samples_path="synthetic",
        held_out=device.measure(plan.held_out_points, seed + 1),
        finetune_throughput=synthetic_finetune_throughput(grid),
    )


def is_synthetic(profile: Profile) -> bool:
    """True for a profile built here (or named so): nothing computed from it is a measurement."""
    return "synthetic" in profile.device_name.lower()


if __name__ == "__main__":
    SHIPPED_PATH.parent.mkdir(parents=True, exist_ok=True)
    build_synthetic_profile().save(SHIPPED_PATH)
    print(f"wrote {SHIPPED_PATH}")
