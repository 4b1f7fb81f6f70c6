"""How a `harvest serve --fleet` worker takes part in its fleet, checked at the CLI edge."""

import re
from dataclasses import dataclass

from base.errors import HarvestError
from harvest.fleet.round_policy import RoundPolicy

REPLICA_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,63}")
"""torchft appends ":<uuid>" to a replica id: no colon in ours."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    lighthouse: str
    """The torchft lighthouse's URL (`--fleet`), e.g. http://10.0.0.5:29510."""
    replica_id: str
    """This worker's name in the fleet (`--replica-id`): unique among the live members."""
    data_shard: tuple[int, int]
    """(K, N): the worker trains shard K of N of the job's dataset (`--fleet-shard K/N`)."""
    policy: RoundPolicy
    """When this worker starts a round (`--fleet-round-tokens`, `--fleet-round-s`)."""
    checkpoint_dir: str | None = None
    """Where the round's first member writes the fleet's adapter and a restarted fleet resumes from
    (`--fleet-checkpoint-dir`, shared by the members); None: each worker's output_dir/fleet-rounds."""
    min_members: int = 1
    """Members a round waits for (`--fleet-min-members`)."""
    timeout_s: float = 60.0
    """The longest a join or a round's communication may take before the member gives up on it."""

    def __post_init__(self) -> None:
        if not self.lighthouse.startswith(("http://", "https://")) or ":" not in self.lighthouse.split("//", 1)[1]:
            raise HarvestError(f"--fleet {self.lighthouse!r} is not a lighthouse URL (http://HOST:PORT)")
        if not REPLICA_ID_PATTERN.fullmatch(self.replica_id):
            raise HarvestError(f"--replica-id {self.replica_id!r} must match {REPLICA_ID_PATTERN.pattern}")
        if self.min_members < 1:
            raise HarvestError(f"--fleet-min-members must be >= 1, got {self.min_members}")


def parse_shard(value: str | None) -> tuple[int, int]:
    if value is None:
        raise HarvestError("--fleet needs --fleet-shard K/N: which shard of the job's data this worker trains")
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError:
        raise HarvestError(f"--fleet-shard must be K/N (two whole numbers), got {value!r}") from None
    if not 0 <= index < count:
        raise HarvestError(f"--fleet-shard {value}: K must be in 0..N-1")
    return index, count
