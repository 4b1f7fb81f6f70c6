"""`harvest finetune CFG.yaml` end to end on the tiny Llama: log, checkpoints, a PEFT-loadable adapter."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch
import yaml
from conftest import lora_state_dict
from safetensors.torch import load_file

from harvest.cli.main import main
from harvest.finetune.demo.tiny_job import write_tiny_job

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_finetune_cli_trains_logs_and_writes_a_peft_adapter(tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path = write_tiny_job(tmp_path, max_steps=4, save_steps=2)
    out_dir = tmp_path / "cli-out"
    argv = ["finetune", str(path), "--output-dir", str(out_dir), "--window", "1", "--set", "learning_rate=0.01"]
    assert main(argv + ["--quiet"]) == 0
    assert "finished 4 steps" in capsys.readouterr().err

    log = [json.loads(line) for line in (out_dir / "finetune_log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in log] == [1, 2, 3, 4]
    assert all(record["tokens_per_s"] > 0 and record["window"] == 1 for record in log)
    assert log[0]["lr"] == 0.01  # the --set override reached LlamaFactory's scheduler
    assert sorted(p.name for p in out_dir.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    base_dir = yaml.safe_load(path.read_text())["model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, out_dir)
    saved = load_file(out_dir / "adapter_model.safetensors")
    loaded = {name: p for name, p in model.named_parameters() if "lora_" in name}
    assert len(loaded) == len(saved) > 0
    for key, weight in saved.items():
        name = key.replace(".weight", ".default.weight")
        assert torch.equal(loaded[name].detach(), weight), key
    assert any(w.abs().max() > 0 for k, w in saved.items() if "lora_B" in k)

    assert main(argv + ["--quiet", "--resume", "--max-steps", "6"]) == 0
    log = [json.loads(line) for line in (out_dir / "finetune_log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in log] == [1, 2, 3, 4, 5, 6]


@pytest.mark.trainer
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path):
    """Pins kill -9 safety: checkpoints are renamed into place whole, and --resume replays the data order."""
    import signal
    import subprocess
    import sys
    import time

    from harvest.finetune import FinetuneEngine

    path = write_tiny_job(tmp_path, max_steps=60, save_steps=3)
    reference = FinetuneEngine.from_yaml(path, overrides={"output_dir": str(tmp_path / "reference")})
    while not reference.is_finished:
        reference.run_step()

    out_dir = tmp_path / "killed"
    argv = [sys.executable, "-m", "harvest.cli.main", "finetune", str(path), "--output-dir", str(out_dir)]
    argv += ["--quiet", "--num-threads", "1"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(out_dir.glob("checkpoint-*")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    checkpoints = sorted(int(p.name.split("-")[1]) for p in out_dir.glob("checkpoint-*"))
    assert checkpoints and checkpoints[-1] < 60, "the kill must land before the run finished"

    assert main(["finetune", str(path), "--output-dir", str(out_dir), "--resume", "--quiet"]) == 0
    saved = load_file(out_dir / "adapter_model.safetensors")
    expected = lora_state_dict(reference)
    assert saved.keys() == expected.keys()
    for key, weight in expected.items():
        torch.testing.assert_close(saved[key], weight, rtol=1e-5, atol=1e-7)


def test_resume_of_a_finished_job_says_so_and_each_run_closes_once(tmp_path, capsys, monkeypatch):
    """Pins two finish-line bugs: `--resume` of a finished job formatted its None loss with :.4f (TypeError),
    and a finished run wrote its final checkpoint and adapter twice (the engine closed itself, then the CLI
    closed it again). Forced by counting FinetuneEngine.close calls over a run to the end and a --resume."""
    from harvest.finetune import FinetuneEngine

    closed_at_steps = []
    close = FinetuneEngine.close
    monkeypatch.setattr(FinetuneEngine, "close", lambda self: closed_at_steps.append(self.global_step) or close(self))
    argv = ["finetune", str(write_tiny_job(tmp_path, max_steps=2)), "--output-dir", str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 0
    assert closed_at_steps == [2]
    adapter = load_file(tmp_path / "out" / "adapter_model.safetensors")
    capsys.readouterr()

    assert main(argv + ["--resume"]) == 0
    assert "already finished at step 2" in capsys.readouterr().err
    assert closed_at_steps == [2, 2]
    resumed_adapter = load_file(tmp_path / "out" / "adapter_model.safetensors")
    assert all(torch.equal(resumed_adapter[key], weight) for key, weight in adapter.items())
