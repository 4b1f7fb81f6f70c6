"""FleetSync: one worker's side of the fleet's rounds, called by the training loop at optimizer-step
boundaries (the only place the adapter is whole), with the communication on its own thread.

A round: the adapter's change since the fleet's last adapter (the base), weighted by the tokens this
worker trained since, summed over the round's members with torchft's fault-tolerant all-reduce; if the
round commits, base += the weighted mean. The worker keeps training while the round is in flight; when it
is applied, the steps trained meanwhile stay on top of the new base (their count is the round's staleness).
A worker that joins or restarts takes the base from a live peer (torchft's healing) before it trains.

Deferred imports: torchft (and the OpenTelemetry SDK it pulls in) only when a job joins a fleet.
"""

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import ReduceOp, TCPStore

from base.errors import HarvestError
from harvest.fleet import adapter_delta
from harvest.fleet.round_policy import RoundPolicy


@dataclass(frozen=True, slots=True)
class RoundResult:
    round: int
    """The fleet's committed rounds after this one (the adapter's version)."""
    committed: bool
    members: int
    tokens: int
    """Tokens this worker contributed."""
    fleet_tokens: int
    """Tokens all members contributed."""
    sync_ms: float
    """Wall time of the round's communication (quorum, all-reduce, commit) on the fleet thread."""
    staleness: int
    """Optimizer steps this worker trained while the round was in flight, kept on top of the new base."""
    is_writer: bool
    """This worker is the round's first member: the one that checkpoints the fleet's adapter."""
    is_foreign: bool = False
    """A member of the round had another job fingerprint: nobody applied it."""


def make_manager(lighthouse_addr: str, replica_id: str, min_members: int, timeout_s: float, state_fns):
    """A torchft Manager for a one-process replica group: its own TCPStore and gloo process group. Gloo on a GPU
    host too: a round's buffer is the adapter's delta on the host (megabytes, once a round), and NCCL would run
    its all-reduce as kernels on the SMs that decode and the job share, outside any unit the controller plans."""
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    timeout = timedelta(seconds=timeout_s)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), load_state_dict=state_fns[0], state_dict=state_fns[1],
        min_replica_size=min_members, use_async_quorum=False, timeout=timeout, quorum_timeout=timeout,
        connect_timeout=timeout, rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
        lighthouse_addr=lighthouse_addr, replica_id=replica_id, hostname="127.0.0.1",
    )
    return manager, store


logger = logging.getLogger(__name__)


class FleetSync:
    def __init__(self, params: list[torch.Tensor], policy: RoundPolicy, lighthouse_addr: str, replica_id: str,
                 min_members: int = 1, timeout_s: float = 30.0, fingerprint: int = 0,
                 resume_from: tuple[int, list[torch.Tensor]] | None = None) -> None:
        """`params`: the adapter's trainable tensors, the same order on every worker. Joins the fleet now
        (blocks until a round with min_members forms), taking the fleet's adapter if it is behind.
        `fingerprint`: what must be equal on every member (job_fingerprint: the base model, the adapter's
        shapes, the training settings); a member whose first round finds another is refused (HarvestError).
        `resume_from` (round R, the adapter's tensors in `params` order): a checkpointed round of the fleet this
        member starts from, numbering its rounds on from R; a live peer further on still heals it."""
        self.params = params
        self.fingerprint = fingerprint
        self.policy = policy
        self.replica_id = replica_id
        self._base = adapter_delta.flatten(params)
        self._healed = False
        self._manager, self._store = make_manager(lighthouse_addr, replica_id, min_members, timeout_s,
                                                  (self._load_state, self._state))
        if resume_from is not None:
            round_number, tensors = resume_from
            adapter_delta.assign(params, adapter_delta.flatten(tensors))
            self._base = adapter_delta.flatten(params)
            self._manager.load_state_dict({"step": round_number, "batches_committed": 0})
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-round")
        self._in_flight: Future | None = None
        self._sent: torch.Tensor | None = None
        self._sent_tokens = 0
        self._steps_in_flight = 0
        self._tokens = 0
        self._round_started = time.monotonic()
        self.last: RoundResult | None = None
        self._checksum = _checksum(self._base)
        self.resumed_round = None if resume_from is None else resume_from[0]
        self.tokens_contributed = 0
        self.sync_ms_total = 0.0
        self._start_round(0)
        first = self.wait()
        if first is not None and first.is_foreign:
            self.close()
            raise HarvestError(f"the fleet at {lighthouse_addr} trains another job or base model than this worker "
                               "(their job fingerprints differ): give every member the same job and --model-path")

    # ---- torchft's healing: the state a live peer sends a joining one ----

    def _state(self) -> dict[str, Any]:
        return {"base": self._base}

    def _load_state(self, state: dict[str, Any]) -> None:
        self._base = state["base"].to("cpu", torch.float32).clone()
        self._healed = True

    # ---- the training loop's hook ----

    def on_step_end(self, tokens: int) -> RoundResult | None:
        """After an optimizer step that trained `tokens`: apply a round that has finished, start one that is
        due. Returns the round applied now, if any."""
        self._tokens += tokens
        applied = None
        if self._in_flight is not None:
            self._steps_in_flight += 1
            if self._in_flight.done():
                applied = self._apply()
        if self._in_flight is None and self.policy.is_due(self._tokens, time.monotonic() - self._round_started):
            self._start_round(self._tokens)
        return applied

    def wait(self) -> RoundResult | None:
        """Block until the round in flight is applied (a test's round after every step; shutdown)."""
        return self._apply() if self._in_flight is not None else None

    def close(self) -> None:
        self.wait()
        self._thread.shutdown()
        self._manager.shutdown(wait=False)

    def base_tensors(self) -> list[torch.Tensor]:
        """The fleet's adapter as of the last committed round, shaped like `params` (host copies)."""
        out, offset = [], 0
        for p in self.params:
            out.append(self._base[offset:offset + p.numel()].view(p.shape).clone())
            offset += p.numel()
        return out

    def stats(self) -> dict[str, Any]:
        last = self.last
        return {
            "replica_id": self.replica_id,
            "round": last.round if last else 0,
            "members": last.members if last else 0,
            "tokens_contributed": self.tokens_contributed,
            "last_round_tokens": last.tokens if last else 0,
            "fleet_tokens": last.fleet_tokens if last else 0,
            "sync_ms": last.sync_ms if last else None,
            "sync_ms_total": self.sync_ms_total,
            "staleness": last.staleness if last else 0,
            "in_flight": self._in_flight is not None,
            "adapter_checksum": self._checksum,
            "resumed_round": self.resumed_round,
        }

    # ---- a round ----

    def _start_round(self, tokens: int) -> None:
        self._sent = adapter_delta.flatten(self.params)
        self._sent_tokens = tokens
        self._tokens = 0
        self._steps_in_flight = 0
        self._round_started = time.monotonic()
        buffer = adapter_delta.weighted_buffer(self._sent - self._base, tokens)
        self._in_flight = self._thread.submit(self._communicate, buffer)

    def _communicate(self, buffer: torch.Tensor) -> tuple[torch.Tensor, bool, int, bool, float, bool]:
        """On the fleet thread: quorum (a behind member heals here), the fingerprints' all-reduce, the delta's,
        the commit vote. Every member sums (f, f^2): all fingerprints are equal iff sum^2 == members * sum of
        squares; if not, every member skips the delta (whose size may differ) and votes the round down."""
        started = time.perf_counter()
        manager = self._manager
        manager.start_quorum()
        if self._healed:
            buffer.zero_()  # its change was made on an adapter the fleet has moved past: it adds nothing
        fingerprints = torch.tensor([float(self.fingerprint), float(self.fingerprint) ** 2], dtype=torch.float64)
        manager.allreduce(fingerprints, reduce_op=ReduceOp.SUM).wait()
        members = manager.num_participants()
        is_foreign = fingerprints[0].item() ** 2 != members * fingerprints[1].item()
        if is_foreign:
            manager.report_error(HarvestError("a member of the round trains another job or base model"))
        else:
            manager.allreduce(buffer, reduce_op=ReduceOp.SUM).wait()
        committed = manager.should_commit() and not is_foreign
        is_writer = manager.participating_rank() == 0
        return buffer, committed, members, is_writer, (time.perf_counter() - started) * 1e3, is_foreign

    def _apply(self) -> RoundResult:
        summed, committed, members, is_writer, sync_ms, is_foreign = self._in_flight.result()
        if is_foreign and self.last is not None:
            logger.warning("harvest fleet: a member with another job or base model joined round %d: not applied",
                           self._manager.current_step())
        self._in_flight = None
        fleet_tokens = 0
        if committed:
            mean, fleet_tokens = adapter_delta.weighted_mean(summed)
            new_base = self._base + mean
            if self._healed:
                # A joining worker drops what it had and takes the fleet's adapter.
                adapter_delta.assign(self.params, new_base)
                self._healed = False
            else:
                adapter_delta.assign(self.params, adapter_delta.flatten(self.params) - self._sent + new_base)
            self._base = new_base
            self._checksum = _checksum(new_base)
            self.tokens_contributed += self._sent_tokens
        else:
            self._tokens += self._sent_tokens  # the change is still unsent: the next round carries it
        self.sync_ms_total += sync_ms
        self.last = RoundResult(self._manager.current_step(), committed, members, self._sent_tokens if committed
                                else 0, fleet_tokens, sync_ms, self._steps_in_flight, is_writer, is_foreign)
        return self.last


def _checksum(flat: torch.Tensor) -> list[float]:
    """Sum and sum of squares of the fleet's adapter (float64): members holding the same adapter show the same
    two numbers in their stats; cheaper than hashing its bytes at every round."""
    wide = flat.to(torch.float64)
    return [round(wide.sum().item(), 9), round(wide.square().sum().item(), 9)]
