"""The adapter harvest writes is one SGLang's LoRA loader accepts, stacked as SGLang stacks it. A worker serving
it from `--lora-paths`: tests/test_finetune_publish.py, beside the adapter its job publishes."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch
import yaml
from safetensors.torch import load_file

from harvest.finetune import FinetuneEngine
from harvest.finetune.demo.tiny_job import write_tiny_job

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ADAPTER_NAME = "harvest-tiny"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> tuple[str, str]:
    """(base model dir, adapter dir) after a few steps of training with a large LR, so B is far from 0."""
    job_path = write_tiny_job(tmp_path_factory.mktemp("lora"), max_steps=3, learning_rate=0.01)
    engine = FinetuneEngine.from_yaml(job_path)
    while not engine.is_finished:
        engine.run_step()
    engine.close()
    return yaml.safe_load(job_path.read_text())["model_name_or_path"], str(engine.llamafactory.output_dir)


def test_sglang_lora_loader_accepts_the_adapter_and_stacks_its_weights(adapter, monkeypatch):
    from sglang.srt import server_args
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.lora.lora import LoRAAdapter
    from sglang.srt.lora.lora_config import LoRAConfig
    from sglang.srt.lora.utils import get_normalized_target_modules
    from transformers import AutoConfig

    from harvest.sglang.launcher import build_sglang_argv, parse_sglang_args

    model_dir, adapter_dir = adapter
    argv = build_sglang_argv(model_dir, ["--enable-lora", "--lora-paths", f"{ADAPTER_NAME}={adapter_dir}"], True,
                             has_job=False)
    monkeypatch.setattr(server_args, "_global_server_args", parse_sglang_args(argv))  # the weight loader reads them
    config = LoRAConfig(adapter_dir)
    assert config.lora_added_tokens_size == 0 and not config.use_dora  # what LoRAManager rejects
    assert get_normalized_target_modules(config.target_modules) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    base_config = AutoConfig.from_pretrained(model_dir)
    loaded = LoRAAdapter(ADAPTER_NAME, config, base_config, LoadConfig(), lora_backend=None)
    loaded.initialize_weights()
    assert loaded.scaling == config.lora_alpha / config.r

    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    assert len(loaded.layers) == base_config.num_hidden_layers
    for layer_id, layer in enumerate(loaded.layers):
        prefix = f"base_model.model.model.layers.{layer_id}"

        def peft(module, kind):
            return saved[f"{prefix}.{module}.lora_{kind}.weight"]

        def sglang(module, kind):
            return layer.weights[f"{prefix}.{module}.lora_{kind}.weight"]

        assert len(layer.weights) == 8
        # qkv_proj B: [q + k + v out features, r]; A: the three A's stacked on the rank dim
        for kind in "AB":
            q, k, v = (peft(f"self_attn.{name}", kind) for name in ("q_proj", "k_proj", "v_proj"))
            assert torch.equal(sglang("self_attn.qkv_proj", kind), torch.cat((q, k, v)))
            gate, up = peft("mlp.gate_proj", kind), peft("mlp.up_proj", kind)
            assert torch.equal(sglang("mlp.gate_up_proj", kind), torch.cat((gate, up)))
            for module in ("self_attn.o_proj", "mlp.down_proj"):
                assert torch.equal(sglang(module, kind), peft(module, kind))
    assert any(w.abs().max() > 0 for k, w in saved.items() if "lora_B" in k)
