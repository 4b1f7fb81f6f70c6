"""Acceptance (issue 34): two fleet replicas, a round after every optimizer step, equal shards of equal
token counts, train the same adapter as one worker trained on the union at the same effective batch.

Real parts: the finetune engine on the tiny Llama through LlamaFactory, torchft's lighthouse, managers
and gloo over loopback, one process per replica. Plain SGD with a constant LR and no clipping, where
local SGD with a round every step is exactly data parallelism: the mean of the replicas' updates is the
update on the union's mean loss. Tolerance: float32 sums in another order, rtol 1e-4, atol 1e-7.
"""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import run_fleet
from harvest.finetune import FinetuneEngine
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.finetune.publishing import adapter_tensors

pytestmark = [pytest.mark.trainer, pytest.mark.usefixtures("one_torch_thread")]

# Two rows of the demo's kind with the same number of tokens (the test checks it): equal shards.
SHARDS = [
    [{"instruction": "Add 59 and 63.", "input": "", "output": "59 + 63 = 122."}],
    [{"instruction": "Add 84 and 37.", "input": "", "output": "84 + 37 = 121."}],
]
STEPS = 4
JOB = {"optim": "sgd", "learning_rate": 0.5, "lr_scheduler_type": "constant", "max_grad_norm": 0.0,
       "gradient_accumulation_steps": 1, "max_steps": STEPS, "lora_dropout": 0.0, "warmup_steps": 0}


def write_dataset(directory, rows) -> dict:
    directory.mkdir(parents=True)
    (directory / "rows.json").write_text(json.dumps(rows))
    (directory / "dataset_info.json").write_text(json.dumps({"fleet_rows": {"file_name": "rows.json"}}))
    return {"dataset": "fleet_rows", "dataset_dir": str(directory)}


def train_replica(lighthouse: str, job_path, replica_id: str, out_path: str, checkpoint_dir: str, queue) -> None:
    from harvest.fleet import RoundPolicy
    from harvest.fleet.replica import run_replica

    torch.set_num_threads(1)
    run = run_replica(job_path, lighthouse, replica_id, RoundPolicy(every_tokens=1), min_members=2,
                      wait_each_round=True, checkpoint_dir=checkpoint_dir)
    save_file(run["adapter"], out_path)
    queue.put((replica_id, run["tokens"], [(r.round, r.members, r.committed, r.tokens) for r in run["rounds"]]))


def test_two_replicas_with_a_round_each_step_equal_one_worker_on_the_union(tmp_path):
    jobs = [write_tiny_job(tmp_path, **JOB, per_device_train_batch_size=1, output_dir=str(tmp_path / f"out-r{i}"),
                           **write_dataset(tmp_path / f"shard-{i}", rows)) for i, rows in enumerate(SHARDS)]
    union = write_tiny_job(tmp_path, **JOB, per_device_train_batch_size=2, output_dir=str(tmp_path / "out-union"),
                           **write_dataset(tmp_path / "union", SHARDS[0] + SHARDS[1]))

    reports = run_fleet(train_replica, [(str(job), f"r{i}", str(tmp_path / f"r{i}.safetensors"),
                                         str(tmp_path / "fleet-checkpoints")) for i, job in enumerate(jobs)],
                        timeout_s=240)

    (tokens_0, rounds_0), (tokens_1, rounds_1) = reports["r0"], reports["r1"]
    assert tokens_0 == tokens_1 > 0  # equal shards: the weights are equal, the mean is plain
    assert rounds_0 == rounds_1 and len(rounds_0) == STEPS
    assert all(members == 2 and committed for _, members, committed, _ in rounds_0)

    engine = FinetuneEngine.from_yaml(union)
    while not engine.is_finished:
        engine.run_step()
    expected = adapter_tensors(engine.peft_model)
    replicas = [load_file(tmp_path / f"r{i}.safetensors") for i in range(2)]
    assert replicas[0].keys() == replicas[1].keys() == expected.keys()
    assert any(w.abs().max() > 1e-4 for k, w in expected.items() if "lora_B" in k)  # training moved B
    # one member wrote each round's adapter, the round in its metadata; the last one is the fleet's adapter
    written = sorted(tmp_path.joinpath("fleet-checkpoints").glob("round-*/adapter_model.safetensors"),
                     key=lambda path: int(path.parent.name.removeprefix("round-")))
    assert [path.parent.name for path in written] == [f"round-{r}" for r, *_ in sorted(rounds_0)]
    with safe_open(written[-1], "pt") as last:
        assert last.metadata()["fleet_round"] == str(max(rounds_0)[0])
        assert all(torch.equal(last.get_tensor(key), replicas[0][key]) for key in replicas[0])
    for key, weight in expected.items():
        assert torch.equal(replicas[0][key], replicas[1][key]), key  # one adapter in the fleet
        assert torch.allclose(replicas[0][key], weight, rtol=1e-4, atol=1e-7), key
