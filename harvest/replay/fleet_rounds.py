"""The fleet's rounds over its workers' unit logs, as fleet_sync.py runs them.

At a unit's end (FleetSync's step end) a worker adds the unit's tokens, applies its round in flight if the
round has finished, and starts the next round if RoundPolicy says one is due (tokens trained or seconds since
it started its last). A round is a collective over every member: it finishes `round_ms` after its last member
joins; meanwhile the members that joined earlier wait on the fleet thread and keep training (fleet_sync.py),
and what they train stays on top of the new adapter (it goes into their next round). So no trained token is
discarded: a round's cut wastes nothing (`wasted_tokens` is 0 by that design, reported as such).

The round's communication is charged to every member like a unit: `round_ms` of the worker's finetune time,
from the moment the last member joins, trains nothing. It never delays a decode step, so the units keep
their times and a charged unit trains the part of its tokens the charge leaves it.
"""

import heapq
from dataclasses import dataclass, field

from harvest.fleet.round_policy import RoundPolicy
from harvest.replay.fleet_worker import UnitLog


@dataclass(slots=True)
class FleetRound:
    num_joined: int = 0
    tokens: float = 0.0
    """Tokens the members sent: trained since each one's previous round started."""
    first_join_s: float = 0.0
    done_s: float | None = None
    """When its all-reduce finishes (None until every member joined)."""


@dataclass(slots=True)
class FleetOutcome:
    tokens: list[float]
    """Per worker: tokens trained, net of the sync's charge."""
    finetune_ms: list[float]
    """Per worker: the units' time (finetune time, charged or not)."""
    charged_ms: list[float]
    """Per worker: finetune time the rounds took."""
    unpaid_ms: list[float]
    """Per worker: charge left at the end (the worker had no finetune time to pay it with)."""
    rounds: list[FleetRound] = field(default_factory=list)
    in_flight_tokens: list[float] = field(default_factory=list)
    """Per worker: tokens trained while one of its rounds was in flight (kept on top: the rounds' staleness)."""
    wait_s: float = 0.0
    """Over the finished rounds and members: time from a member's join to the round's end, less round_ms."""

    def finished_rounds(self, end_s: float) -> list[FleetRound]:
        return [r for r in self.rounds if r.done_s is not None and r.done_s <= end_s]


def run_rounds(logs: list[UnitLog], policy: RoundPolicy | None, round_ms: float) -> FleetOutcome:
    """Rounds of a fleet of len(logs) members; `policy` None or one member: no rounds (no fleet)."""
    n = len(logs)
    totals = [float(log.tokens.sum()) for log in logs]
    finetune_ms = [float(log.unit_ms.sum()) for log in logs]
    if policy is None or n < 2:
        return FleetOutcome(totals, finetune_ms, [0.0] * n, [0.0] * n, [], [0.0] * n)
    ends = [log.end_s.tolist() for log in logs]
    unit_ms = [log.unit_ms.tolist() for log in logs]
    unit_tokens = [log.tokens.tolist() for log in logs]
    tokens, debt_ms, charged_ms = [0.0] * n, [0.0] * n, [0.0] * n
    since_tokens, started_s = [0.0] * n, [0.0] * n
    in_flight: list[int | None] = [None] * n
    next_round, in_flight_tokens = [0] * n, [0.0] * n
    rounds: list[FleetRound] = []
    wait_s = 0.0
    joined_s: list[list[float]] = []
    heap = [(e[0], w, 0) for w, e in enumerate(ends) if e]
    heapq.heapify(heap)
    while heap:
        t, w, i = heapq.heappop(heap)
        if i + 1 < len(ends[w]):
            heapq.heappush(heap, (ends[w][i + 1], w, i + 1))
        ms, trained = unit_ms[w][i], unit_tokens[w][i]
        if debt_ms[w] > 0 and ms > 0:
            paid = min(debt_ms[w], ms)
            debt_ms[w] -= paid
            trained *= 1.0 - paid / ms
        tokens[w] += trained
        since_tokens[w] += trained
        k = in_flight[w]
        if k is not None:
            done_s = rounds[k].done_s
            if done_s is not None and done_s <= t:
                in_flight[w] = None
            else:
                in_flight_tokens[w] += trained
        if in_flight[w] is None and policy.is_due(since_tokens[w], t - started_s[w]):
            k = next_round[w]
            next_round[w] += 1
            if k == len(rounds):
                rounds.append(FleetRound(first_join_s=t))
                joined_s.append([])
            r = rounds[k]
            r.num_joined += 1
            r.tokens += since_tokens[w]
            joined_s[k].append(t)
            since_tokens[w], started_s[w], in_flight[w] = 0.0, t, k
            if r.num_joined == n:
                r.done_s = t + round_ms / 1e3
                wait_s += sum(t - s for s in joined_s[k])
                for m in range(n):
                    debt_ms[m] += round_ms
                    charged_ms[m] += round_ms
    return FleetOutcome(tokens, finetune_ms, charged_ms, debt_ms, rounds, in_flight_tokens, wait_s)
