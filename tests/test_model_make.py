"""`harvest model make`: named shapes, random weights with the real tensor layout, served without a tokenizer."""

import asyncio
import json
import subprocess

import httpx
import pytest
from conftest import free_port

from base.errors import HarvestError
from harvest.models.model_shape import SHAPES, ModelShape
from harvest.models.random_model import RandomModelSpec, make_random_model
from harvest.worker.client import generate_prefilled
from harvest.worker.process import WorkerProcess


def test_llama3_8b_preset_counts_the_published_parameters_and_bytes():
    """Pins the 8B preset by arithmetic from its config numbers, without writing 16 GB."""
    shape = ModelShape.from_name("llama3-8b")
    h, layers, vocab, ffn, kv = 4096, 32, 128256, 14336, 8 * 128
    per_layer = 2 * h * h + 2 * kv * h + 3 * h * ffn + 2 * h
    expected = layers * per_layer + 2 * vocab * h + h
    assert shape.num_parameters() == expected == 8_030_261_248
    # One bf16 decode step at batch 1 reads every matrix and one embedding row.
    assert shape.decode_weight_bytes(2) == 2 * (expected - vocab * h + h)
    assert shape.kv_bytes_per_token(2) == 2 * layers * kv * 2 == 131072


def test_unknown_shape_is_one_line_error():
    with pytest.raises(HarvestError, match="unknown model shape 'llama9'.*llama3-8b"):
        ModelShape.from_name("llama9")


@pytest.mark.parametrize("name", list(SHAPES))
def test_preset_layout_matches_transformers_llama(name):
    """Every tensor name and shape the preset writes is exactly what LlamaForCausalLM declares (meta device)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SHAPES[name]
    config = LlamaConfig(**{k: v for k, v in shape.hf_config("bfloat16").items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    declared = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if shape.tie_word_embeddings:
        declared.pop("lm_head.weight")
    assert declared == shape.tensor_shapes()


def test_tiny_model_files_hold_the_declared_tensors(tmp_path, harvest_cli):
    from safetensors import safe_open

    out = subprocess.run([*harvest_cli, "model", "make", "--shape", "tiny", "--random", "--out", str(tmp_path / "m")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    shape = SHAPES["tiny"]
    found = {}
    for file_name in set(index["weight_map"].values()):
        with safe_open(tmp_path / "m" / file_name, "pt") as f:
            found |= {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    assert {k: s for k, (s, _) in found.items()} == shape.tensor_shapes()
    assert {d for _, d in found.values()} == {"BF16"}
    assert index["metadata"]["total_size"] == summary["weight_bytes"] == 2 * shape.num_parameters()

    again = subprocess.run([*harvest_cli, "model", "make", "--shape", "tiny", "--random", "--out", str(tmp_path / "m")],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "not empty" in again.stderr and "Traceback" not in again.stderr


def test_shards_split_at_the_shard_size(tmp_path, monkeypatch):
    import harvest.models.random_model as random_model

    monkeypatch.setattr(random_model, "SHARD_BYTES", 64 * 1024)
    summary = make_random_model(RandomModelSpec(SHAPES["tiny"], tmp_path / "m"))
    assert summary["num_shards"] > 1
    assert all(p.stat().st_size <= 64 * 1024 + 8192 for p in (tmp_path / "m").glob("*.safetensors"))


@pytest.mark.sglang
def test_worker_serves_tokenizerless_model_from_token_ids(tmp_path):
    """SGLang loads the random model with --skip-tokenizer-init and decodes the token ids the client sends."""
    model_dir = make_random_model(RandomModelSpec(SHAPES["tiny"], tmp_path / "m", dtype="fp32"))["out_dir"]
    worker = WorkerProcess(["--model-path", model_dir, "--skip-tokenizer-init", "--max-total-tokens", "2048"],
                           free_port(), free_port(), tmp_path / "worker.log").start()
    try:
        async def go():
            async with httpx.AsyncClient(timeout=120) as client:
                return await generate_prefilled(client, worker.url, list(range(5, 25)), 6, room=7)

        result = asyncio.run(go())
    finally:
        worker.stop()
    assert len(result["output_ids"]) == 6
    assert all(0 <= t < SHAPES["tiny"].vocab_size for t in result["output_ids"])
