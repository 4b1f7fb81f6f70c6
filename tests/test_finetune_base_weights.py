"""The base-weight mode a job reports: the served model is recognised by fingerprint, not by path."""

import shutil

from harvest.finetune.base_weights import base_weight_mode, model_fingerprint
from harvest.models.tiny_llama import build_tiny_llama


def test_a_copy_of_the_served_model_is_the_served_model_and_another_model_is_not(tmp_path):
    served = build_tiny_llama(tmp_path / "served", num_hidden_layers=2)
    copy = shutil.copytree(served, tmp_path / "elsewhere")
    other = build_tiny_llama(tmp_path / "other", num_hidden_layers=1)
    assert model_fingerprint(copy) == model_fingerprint(served) != model_fingerprint(other)

    same = base_weight_mode(copy, served)
    assert same["is_served_model"] and same["mode"] == "copy" and "not built yet" in same["reason"]
    different = base_weight_mode(other, served)
    assert not different["is_served_model"] and different["mode"] == "copy"
    assert "differs from the served model" in different["reason"]
    assert base_weight_mode(served, None)["reason"] == "no served model (a job outside a worker)"


def test_changed_weight_bytes_change_the_fingerprint(tmp_path):
    served = build_tiny_llama(tmp_path / "served", num_hidden_layers=1)
    changed = shutil.copytree(served, tmp_path / "changed")
    weights = next(changed.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert model_fingerprint(changed) != model_fingerprint(served)
