"""A fleet round through real torchft (lighthouse, managers, gloo over loopback), one process per replica:
the fleet's adapter moves by the members' deltas weighted by the tokens each trained, and a member that
trained nothing does not pull the others back."""

import pytest
import torch

from conftest import run_fleet
from harvest.fleet import RoundPolicy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = [[1.0, -2.0, 0.5], [3.0]]


def replica_round(lighthouse: str, replica_id: str, num_members: int, delta: list[float], tokens: int, queue):
    """Join the fleet, move the adapter by `delta`, report `tokens` trained, and send back the round."""
    from harvest.fleet import FleetSync

    torch.set_num_threads(1)
    params = [torch.tensor(values) for values in BASE]
    # every_s: a member that trained nothing still takes part in the round, by time
    fleet = FleetSync(params, RoundPolicy(every_tokens=1, every_s=1e-6), lighthouse, replica_id, min_members=num_members)
    with torch.no_grad():
        params[0] += torch.tensor(delta[:3])
        params[1] += torch.tensor(delta[3:])
    fleet.on_step_end(tokens)
    result = fleet.wait()
    queue.put((replica_id, torch.cat(params).tolist(), result.members, result.fleet_tokens, result.committed))
    fleet.close()


def run_round(deltas: list[list[float]], tokens: list[int]) -> dict:
    replicas = [(f"r{i}", len(deltas), delta, n) for i, (delta, n) in enumerate(zip(deltas, tokens))]
    return run_fleet(replica_round, replicas, timeout_s=90)


def test_unequal_tokens_give_the_weighted_mean_and_an_idle_member_adds_nothing():
    deltas = [[0.3, 0.0, -1.0, 2.0], [-0.6, 1.0, 1.0, 0.0], [5.0, 5.0, 5.0, 5.0]]
    tokens = [30, 10, 0]
    results = run_round(deltas, tokens)
    base = torch.tensor([v for values in BASE for v in values])
    d = torch.tensor(deltas)
    expected = base + (30 * d[0] + 10 * d[1]) / 40  # the third member's 5.0s would show if it counted
    assert sorted(results) == ["r0", "r1", "r2"]
    for adapter, members, fleet_tokens, committed in results.values():
        assert committed and members == 3 and fleet_tokens == 40
        assert torch.allclose(torch.tensor(adapter), expected, rtol=0, atol=1e-6)
