"""Who may join a fleet (issue 34): a member with another job fingerprint is refused at its first round while the
fleet's round goes unapplied, a replica id already live at the lighthouse and a lighthouse that is not there
are refused by `harvest serve` before anything starts."""

import threading

import pytest
import torch
from conftest import free_port

from base.errors import HarvestError
from harvest.fleet import FleetSync, RoundPolicy
from harvest.fleet.lighthouse import check_lighthouse, live_replica_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def lighthouse():
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=200, heartbeat_timeout_ms=1000)
    yield server.address()
    server.shutdown()


def test_a_member_of_another_job_is_refused_and_the_fleet_applies_nothing_of_it(lighthouse):
    member = FleetSync([torch.zeros(4)], RoundPolicy(every_tokens=1), lighthouse, "a", timeout_s=5, fingerprint=7)
    refused = []

    def join_other():
        try:
            FleetSync([torch.zeros(6)], RoundPolicy(every_tokens=1), lighthouse, "b", timeout_s=5, fingerprint=9)
        except HarvestError as e:
            refused.append(str(e))

    joiner = threading.Thread(target=join_other)
    joiner.start()
    results = []
    try:
        while joiner.is_alive() and len(results) < 200:
            with torch.no_grad():
                member.params[0] += 1.0
            member.on_step_end(10)
            results.append(member.wait())
        joiner.join(30)
        assert refused and "trains another job or base model" in refused[0]
        foreign = [r for r in results if r.is_foreign]
        assert foreign and not any(r.committed for r in foreign)
        member.on_step_end(10)
        after = member.wait()
        assert after.committed and not after.is_foreign and after.members == 1  # the fleet goes on
    finally:
        member.close()


def test_the_lighthouse_check_refuses_a_live_replica_id_and_no_lighthouse(lighthouse):
    member = FleetSync([torch.zeros(4)], RoundPolicy(every_tokens=1), lighthouse, "w0", timeout_s=5)
    try:
        url = lighthouse.replace("[::]", "127.0.0.1")
        with pytest.raises(HarvestError, match="--replica-id w0: a live member"):
            check_lighthouse(url, "w0")
        check_lighthouse(url, "w1")  # another id is welcome
    finally:
        member.close()
    with pytest.raises(HarvestError, match="no torchft lighthouse answers there"):
        check_lighthouse(f"http://127.0.0.1:{free_port()}", "w0")


def test_live_ids_are_read_from_the_status_page_by_their_age():
    page = ("<li>w0:0e1c8168-8e41-41fd-b8a9-62db2257aa8a: seen 0.029588714s ago</li>"
            "<li>w1:1e1c8168-8e41-41fd-b8a9-62db2257aa8a: seen 12.5s ago</li>"
            "<li>w2:2e1c8168-8e41-41fd-b8a9-62db2257aa8a: seen 850µs ago</li>")
    assert live_replica_ids(page) == {"w0", "w2"}


def test_a_fleet_restarted_whole_resumes_from_its_newest_round_checkpoint(lighthouse, tmp_path):
    from harvest.fleet.round_checkpoint import latest_round_checkpoint, write_round_checkpoint

    write_round_checkpoint({"a": torch.full((4,), 2.0), "b": torch.ones(2)}, 7, tmp_path)
    write_round_checkpoint({"a": torch.zeros(4), "b": torch.zeros(2)}, 3, tmp_path)  # an older round
    params = [torch.zeros(4), torch.zeros(2)]
    member = FleetSync(params, RoundPolicy(every_tokens=1), lighthouse, "r", timeout_s=5,
                       resume_from=latest_round_checkpoint(tmp_path, ["a", "b"]))
    try:
        assert torch.equal(params[0], torch.full((4,), 2.0)) and torch.equal(params[1], torch.ones(2))
        assert member.stats()["resumed_round"] == 7 and member.last.round > 7  # its rounds number on
        member.on_step_end(10)
        assert member.wait().committed
    finally:
        member.close()
    with pytest.raises(HarvestError, match="not this job's adapter"):
        latest_round_checkpoint(tmp_path, ["a", "c"])
    assert latest_round_checkpoint(tmp_path / "none", ["a"]) is None
