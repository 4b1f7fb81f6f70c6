"""`harvest replay --simulate --decode-workers N`: fleets of harvest workers on their own loads, their rounds
and the rounds' sync cost (pure simulation: no worker, fast)."""

import json

import numpy as np
import pytest

from harvest.cli.main import main
from harvest.fleet.round_policy import RoundPolicy
from harvest.replay.fleet_replay import FleetReplay
from harvest.replay.fleet_rounds import run_rounds
from harvest.replay.fleet_sync_cost import SyncCost
from harvest.replay.fleet_worker import UnitLog
from harvest.replay.replay_config import DeviceMemory, ReplayConfig
from harvest.replay.replay_simulation import ReplaySimulation
from predictor import Profile
from predictor.synthetic_profile import SHIPPED_PATH
from traces.trace_loader import load_trace

MEMORY = DeviceMemory.from_name("h100-llama3-8b")
FREE = SyncCost(adapter_bytes=1, link_gbps=1e12, round_latency_ms=0.0)


@pytest.fixture(scope="module")
def simulation():
    return ReplaySimulation(Profile.load(SHIPPED_PATH), MEMORY, ReplayConfig(policies=("harvest",)))


@pytest.fixture(scope="module")
def trace():
    return load_trace("poisson:rate=8,duration=60,seed=0")


def test_a_fleet_of_one_trains_the_single_worker_simulations_tokens(simulation, trace):
    single = simulation.run(trace)["policies"]["harvest"]["finetune"]["decode_device_tokens_per_s"]
    fleet = FleetReplay((1,), "round-robin", RoundPolicy(every_s=5.0), SyncCost(83_886_084)).run(simulation, trace)
    row = fleet["rows"][0]
    assert row["fleet_tokens_per_s"] == pytest.approx(single, rel=1e-9)
    assert row["num_rounds"] == 0 and row["sync_lost_tokens"] == pytest.approx(0.0)


def test_identical_workers_with_free_sync_train_exactly_n_times_one(simulation, trace):
    fleet = FleetReplay((1, 2, 8), "replica", RoundPolicy(every_s=5.0), FREE).run(simulation, trace)
    one, two, eight = (r["fleet_tokens_per_s"] for r in fleet["rows"])
    assert two == pytest.approx(2 * one, rel=1e-9) and eight == pytest.approx(8 * one, rel=1e-9)
    assert fleet["rows"][1]["num_rounds"] >= 10  # rounds did close, every 5 s of the ~60 s span


def test_round_robin_serves_every_request_once(simulation, trace):
    replay = FleetReplay((3,), "round-robin", RoundPolicy(every_s=5.0), FREE)
    workers = [replay._worker(simulation, trace, 3, k, {}) for k in range(3)]
    served = np.sort(np.concatenate([w.run.request_ids for w in workers]))
    assert np.array_equal(served, np.arange(trace.num_requests))


def constant_log(num_units: int, unit_ms: float, tokens_per_unit: float) -> UnitLog:
    ends = np.arange(1, num_units + 1) * unit_ms / 1e3
    return UnitLog(ends, np.full(num_units, unit_ms), np.full(num_units, tokens_per_unit))


def test_sync_cost_takes_exactly_its_time_at_the_units_rate():
    """Two workers, 10 ms units training 30 tokens each (3000 tok/s), a round every 100 tokens: every round's
    120 ms is charged to both, and costs each 120 ms x 3000 tok/s = 360 tokens, nothing else (the time the
    last charge did not find before the end costs nothing)."""
    logs = [constant_log(1000, 10.0, 30.0) for _ in range(2)]
    free = run_rounds(logs, RoundPolicy(every_tokens=100), 0.0)
    charged = run_rounds(logs, RoundPolicy(every_tokens=100), 120.0)
    num_charges = charged.charged_ms[0] / 120.0
    assert num_charges >= 2 and num_charges == int(num_charges)
    for w in range(2):
        paid_s = (charged.charged_ms[w] - charged.unpaid_ms[w]) / 1e3
        assert free.tokens[w] - charged.tokens[w] == pytest.approx(paid_s * 3000.0)
        assert paid_s > (num_charges - 1) * 0.120
        assert free.tokens[w] == pytest.approx(30_000.0)


def test_a_round_waits_for_its_slowest_member_and_keeps_what_the_others_trained():
    """The fast worker trains 3x the slow one's tokens; rounds by tokens close at the slow one's pace and the
    fast one's tokens trained while it waited are kept (wasted is 0 by design), none lost with free sync."""
    fast, slow = constant_log(300, 10.0, 30.0), constant_log(300, 10.0, 10.0)
    outcome = run_rounds([fast, slow], RoundPolicy(every_tokens=100), 0.0)
    assert sum(outcome.tokens) == pytest.approx(9000.0 + 3000.0)
    assert outcome.in_flight_tokens[0] > 0 and outcome.in_flight_tokens[1] == 0
    assert len(outcome.rounds) == pytest.approx(3000.0 / 100.0, abs=1)  # the slow member's pace


def test_ring_all_reduce_cost():
    cost = SyncCost(adapter_bytes=1_000_000_000, link_gbps=8.0, round_latency_ms=50.0)
    assert cost.round_ms(1) == 0.0
    assert cost.round_ms(2) == pytest.approx(50.0 + 1000.0)  # 1 GB at 1 GB/s, sent once
    assert cost.round_ms(64) == pytest.approx(50.0 + 2 * 63 / 64 * 1000.0)


@pytest.mark.parametrize("argv, message", [
    (["--simulate", "--decode-workers", "0"], "--decode-workers must be whole numbers >= 1"),
    (["--simulate", "--decode-workers", "two"], "--decode-workers must be N or N,N"),
    (["--target", "http://127.0.0.1:1", "--decode-workers", "2"], "--decode-workers needs --simulate"),
    (["--simulate", "--fleet-round-s", "5"], "--fleet-round-s needs --decode-workers"),
    (["--simulate", "--decode-workers", "2", "--fleet-round-s", "0"], "every_s 0.0 must be > 0"),
    (["--simulate", "--decode-workers", "2", "--fleet-link-gbps", "-1"], "--fleet-link-gbps must be a positive"),
    (["--simulate", "--decode-workers", "2", "--policy", "temporal"], "give --policy harvest or all"),
])
def test_bad_fleet_flags_are_one_line_errors(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    code = main(["replay", "--trace", "poisson:rate=2,duration=10,seed=0", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_results_json_holds_the_fleet_section(tmp_path, capsys):
    code = main(["replay", "--trace", "poisson:rate=4,duration=30,seed=0", "--simulate", "--policy", "harvest",
                 "--out", str(tmp_path), "--no-plots", "--decode-workers", "1,2", "--fleet-round-s", "5"])
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    rows = results["fleet"]["rows"]
    assert [r["num_workers"] for r in rows] == [1, 2] and rows[1]["num_rounds"] >= 3
    assert rows[1]["sync_share"] > 0 and rows[1]["wasted_tokens"] == 0
    assert isinstance(results["devices"], str)
    assert "fleet of harvest workers" in capsys.readouterr().out
