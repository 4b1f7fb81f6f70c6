"""One compiled layer graph (1 row x 4 positions, no grad): how long its guards take to check (1000 checks of the
first cache entry, through dynamo's guard manager) and a call, against the eager layer; HV_SPEC=1: floats
specialized. Run from the repository root: `[HV_SPEC=1] .venv/bin/python PATH/guard_check.py`."""
import contextlib, json, os, sys, tempfile, time, statistics
from pathlib import Path
import torch
os.sched_setaffinity(0, [1]); torch.set_num_threads(1)
from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune import compiled_layers as cl
from harvest.finetune.decoder_units import RowSlice
if os.environ.get("HV_SPEC"): torch._dynamo.config.specialize_float = True
cfg = Path("harvest/finetune/demo/demo.yaml").resolve()
with contextlib.redirect_stdout(sys.stderr):
    engine = FinetuneEngine.from_yaml(cfg, config=FinetuneConfig(yaml_path=str(cfg), max_unit_ms=75.0, compile_layers=False, warm_up_units=False),
        overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": tempfile.mkdtemp()})
units = engine.units
engine._apply_window()
ids = torch.randint(0, 1000, (1, 4))
row = RowSlice(inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}, loss_denominator=torch.tensor(4.0), num_tokens=4)
units.embed(row)
h = row.hidden[0].detach(); m = cl.owned_mask(row.causal_mask, h)
f = torch.compile(cl._call_layer, dynamic=True, fullgraph=True, options={"cpp_wrapper": True})
with torch.no_grad():
    for l in units.layers[:2]: f(l, h, m, row.position_ids, row.position_embeddings)
entry = torch._dynamo.eval_frame._debug_get_cache_entry_list(cl._call_layer.__code__)[0]
gm = entry.guard_manager
args = dict(layer=units.layers[5], hidden=h, mask=m, position_ids=row.position_ids, position_embeddings=row.position_embeddings)
with torch.no_grad():
    print("check", gm.check(args))
    t = time.perf_counter()
    for _ in range(1000): gm.check(args)
    g = (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(200): f(units.layers[i % 30], h, m, row.position_ids, row.position_embeddings)
    c = (time.perf_counter() - t) / 200
    t = time.perf_counter()
    for i in range(200): cl.call_layer(units.layers[i % 30], h, m, row.position_ids, row.position_embeddings)
    e = (time.perf_counter() - t) / 200
print(json.dumps({"spec": bool(os.environ.get("HV_SPEC")), "guard_check_ms": round(g, 4), "call_ms": round(c * 1e3, 3), "eager_ms": round(e * 1e3, 3)}))
