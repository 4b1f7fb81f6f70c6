"""A fleet of harvest workers training one adapter: local SGD rounds averaged through torchft (issue 34).

Each worker trains on its own; every round (by trained tokens or seconds) the adapter's change since the
last round is averaged over the round's members, weighted by the tokens each trained, and added to the
fleet's adapter. torchft supplies the membership (lighthouse quorum), the fault-tolerant process group and
the healing of a joining replica from a live peer.
"""

from harvest.fleet.fleet_sync import FleetSync, RoundResult
from harvest.fleet.round_policy import RoundPolicy

__all__ = ["FleetSync", "RoundPolicy", "RoundResult"]
