"""Membership through real torchft (lighthouse heartbeats, gloo over loopback), one process per replica:
a replica killed with SIGKILL leaves the fleet and the survivor's rounds go on without it; restarted under
the same id it takes the fleet's adapter from the live peer and, after its first round, holds the same
adapter bytes as the peer."""

import multiprocessing
import os
import queue as queue_module
import signal
import time

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def replica_loop(lighthouse: str, replica_id: str, incarnation: int, delta: float, queue, stop) -> None:
    """Train by adding `delta` each step (10 tokens), a round after every step, report every round."""
    from harvest.fleet import FleetSync, RoundPolicy

    torch.set_num_threads(1)
    params = [torch.zeros(4)]
    fleet = FleetSync(params, RoundPolicy(every_tokens=1), lighthouse, replica_id, min_members=1, timeout_s=3)
    while not stop.is_set():
        with torch.no_grad():
            params[0] += delta
        fleet.on_step_end(10)
        result = fleet.wait()
        queue.put((replica_id, incarnation, result.round, result.members, result.committed, params[0].tolist()))
        time.sleep(0.05)
    fleet.close()


def next_report(queue, predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            report = queue.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue_module.Empty:
            break
        if predicate(*report):
            return report
    raise AssertionError("no such round report within the time")


def test_a_killed_replica_leaves_the_round_and_a_restarted_one_takes_the_peers_adapter():
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=500, heartbeat_timeout_ms=1000)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    queues = {}  # one per process: a process killed while it holds a shared queue's lock would block the others

    def start(replica_id, incarnation, delta):
        queues[replica_id, incarnation] = queue = context.Queue()
        process = context.Process(target=replica_loop,
                                  args=(lighthouse.address(), replica_id, incarnation, delta, queue, stop))
        process.start()
        return process

    processes = [start("r0", 0, 1.0), start("r1", 0, -3.0)]
    try:
        # both in the rounds, then r1 dies mid-training
        next_report(queues["r1", 0], lambda rid, inc, rnd, members, committed, p: members == 2 and committed)
        os.kill(processes[1].pid, signal.SIGKILL)
        processes[1].join(timeout=10)
        # the survivor's rounds go on alone (a round in flight at the kill may fail; later ones commit)
        solo = next_report(queues["r0", 0], lambda rid, inc, rnd, members, committed, p: members == 1 and committed)
        next_report(queues["r0", 0], lambda rid, inc, rnd, members, committed, p: rnd > solo[2] and committed)
        # restarted under the same id: it heals from r0 and its first round is the fleet's again
        processes.append(start("r1", 1, -3.0))
        first = next_report(queues["r1", 1], lambda *report: True)
        assert first[3] == 2 and first[4]
        peer = next_report(queues["r0", 0], lambda rid, inc, rnd, members, committed, p: rnd == first[2])
        assert peer[5] == first[5]  # the same adapter bytes after the rejoined replica's first round
        assert first[5] != [0.0] * 4
    finally:
        stop.set()
        for process in processes:
            process.join(timeout=20)
            if process.is_alive():
                process.kill()
        lighthouse.shutdown()
