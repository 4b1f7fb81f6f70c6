"""Does one torch.compile(dynamic=True) of a decoder layer call serve every layer and sequence length of the demo job?
Layers 0-3 at 96, 80 and 64 positions, each without autograd and with it (then backward), on core 1; prints the
seconds per layer and dynamo's counters. Run from the repository root:
.venv/bin/python eval/results/cpu-2026-11-29/partition-gap/compile_dynamic_probe.py"""
import contextlib, os, sys, tempfile, threading, time
from pathlib import Path
import torch
os.sched_setaffinity(0, [1]); torch.set_num_threads(1)
from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.decoder_units import RowSlice
cfg = Path("harvest/finetune/demo/demo.yaml").resolve()
with contextlib.redirect_stdout(sys.stderr):
    engine = FinetuneEngine.from_yaml(cfg, config=FinetuneConfig(yaml_path=str(cfg)),
        overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": tempfile.mkdtemp()})
engine.run_step()
units = engine.units
def run_layer(layer, h, mask, pos, pe):
    out = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    return out[0] if isinstance(out, tuple) else out
crl = torch.compile(run_layer, dynamic=True)
import torch._dynamo.utils as du
for seq in (96, 80, 64):
    ids = torch.randint(0, 1000, (4, seq))
    row = RowSlice(inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}, loss_denominator=torch.tensor(384.0), num_tokens=384)
    units.embed(row)
    for lid in range(4):
        t = time.perf_counter()
        with torch.no_grad():
            crl(units.layers[lid], row.hidden[0], row.causal_mask, row.position_ids, row.position_embeddings)
        h = row.hidden[0].detach().requires_grad_(True)
        out = crl(units.layers[lid], h, row.causal_mask, row.position_ids, row.position_embeddings)
        out.sum().backward()
        print(seq, lid, round(time.perf_counter() - t, 2), dict(du.counters["stats"]), flush=True)
