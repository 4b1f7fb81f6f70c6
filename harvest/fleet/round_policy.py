"""When a worker starts a round: by tokens trained or seconds passed since its last one, never by steps,
since workers' training rates differ and change with their decode load."""

from dataclasses import dataclass

from base.errors import HarvestError


@dataclass(frozen=True, slots=True)
class RoundPolicy:
    every_tokens: int | None = None
    every_s: float | None = None

    def __post_init__(self) -> None:
        if self.every_tokens is None and self.every_s is None:
            raise HarvestError("fleet rounds: give every_tokens or every_s")
        if self.every_tokens is not None and (isinstance(self.every_tokens, bool) or self.every_tokens < 1):
            raise HarvestError(f"fleet rounds: every_tokens {self.every_tokens!r} must be an integer >= 1")
        if self.every_s is not None and not self.every_s > 0:
            raise HarvestError(f"fleet rounds: every_s {self.every_s!r} must be > 0")

    def is_due(self, tokens: int, elapsed_s: float) -> bool:
        """A round is due after `tokens` trained in `elapsed_s` seconds since the last one."""
        return (self.every_tokens is not None and tokens >= self.every_tokens) or \
            (self.every_s is not None and elapsed_s >= self.every_s)
