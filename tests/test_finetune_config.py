"""Bad configs fail before any work (no tokenization, no model load) with a message naming the key."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import yaml

from base.errors import HarvestError
from harvest.cli.main import main
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.finetune.finetune_config import FinetuneConfig
from harvest.finetune.llamafactory_args import LlamaFactoryArgs

BAD = {
    "dataset": ({"dataset": "no_such_dataset"}, "dataset: 'no_such_dataset'"),
    "template": ({"template": "no_such_template"}, "template: 'no_such_template'"),
    "stage": ({"stage": "dpo"}, "stage: 'dpo'"),
    "model_path": ({"model_name_or_path": "/nonexistent/model"}, "model_name_or_path: '/nonexistent/model'"),
    "finetuning_type": ({"finetuning_type": "full"}, "finetuning_type: 'full'"),
    "deepspeed": ({"deepspeed": "ds_z3_config.json"}, "deepspeed: DeepSpeed"),
    "dataset_dir": ({"dataset_dir": "/nonexistent/data"}, "dataset_dir: '/nonexistent/data'"),
    "missing_dataset": ({"dataset": None}, "dataset: missing"),
    "llamafactory_check": ({"no_such_key": 1}, "LlamaFactory rejected the config"),
    # LlamaFactory's parser lets these through; the job would fail inside the worker (issue 18).
    "lora_rank_type": ({"lora_rank": "eight"}, "lora_rank: 'eight' is not an integer"),
    "lora_rank_range": ({"lora_rank": -1}, "lora_rank: -1 must be >= 1"),
    "learning_rate_text": ({"learning_rate": "1e-3"}, "learning_rate: '1e-3' is not a number"),
    "lora_dropout_range": ({"lora_dropout": 1.0}, "lora_dropout: 1.0 must be in [0, 1)"),
    "bool_type": ({"bf16": "yes"}, "bf16: 'yes' is not true or false"),
}


@pytest.fixture(scope="module")
def good_job(tmp_path_factory):
    return yaml.safe_load(write_tiny_job(tmp_path_factory.mktemp("config")).read_text())


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if the job gets as far as tokenizing data or loading the model."""
    import llamafactory.data
    import llamafactory.model

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the config was rejected")

    monkeypatch.setattr(llamafactory.data, "get_dataset", forbidden)
    monkeypatch.setattr(llamafactory.model, "load_model", forbidden)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_names_the_key_before_any_work(tmp_path, good_job, no_work, case):
    overrides, message = BAD[case]
    job = {**good_job, "output_dir": str(tmp_path / "out"), **overrides}
    job = {k: v for k, v in job.items() if v is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    with pytest.raises(HarvestError) as excinfo:
        LlamaFactoryArgs.from_yaml(path)
    assert message in str(excinfo.value)
    assert not (tmp_path / "out").exists()


def test_cli_prints_one_line_and_exits_2(tmp_path, good_job, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**good_job, "stage": "pt"}))
    assert main(["finetune", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["harvest finetune: error: stage: 'pt' is not supported; harvest trains stage 'sft' only"]
    assert main(["finetune", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_good_config_parses_with_llamafactory_defaults(good_job, tmp_path):
    job = LlamaFactoryArgs.from_dict({**good_job, "output_dir": str(tmp_path / "out")})
    assert job.finetuning_args.stage == "sft" and job.finetuning_args.lora_rank == good_job["lora_rank"]
    assert job.training_args.gradient_accumulation_steps == good_job["gradient_accumulation_steps"]
    assert job.data_args.template == "default"


@pytest.mark.parametrize(
    "kwargs", [{"num_window_layers": 0}, {"max_unit_ms": 0.0}, {"max_slice_rows": 0}, {"log_name": "a/b"},
               {"compile_layers": True, "warm_up_units": False}, {"compile_thread_counts": (1, 0)}]
)
def test_finetune_config_invariants(kwargs):
    with pytest.raises(ValueError):
        FinetuneConfig(**kwargs)
