"""Per-call cost of a compiled layer call, floats unspecialized (torch's default under dynamic=True) against
specialized, in one process, interleaved in blocks of 30 calls so the host's drift hits both alike.
Shapes: 1 row x 4 positions (the call's fixed cost) and 4 rows x 96 (the demo job's unit).
Run from the repository root: `.venv/bin/python PATH/call_cost.py ROUNDS > call-cost.json`; HV_PROFILE=1 adds cProfile
of 60 calls of each."""
import contextlib, json, os, sys, tempfile, time, statistics, types
from pathlib import Path
import torch
os.sched_setaffinity(0, [1]); torch.set_num_threads(1)
from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune import compiled_layers as cl
from harvest.finetune.decoder_units import RowSlice
cfg = Path("harvest/finetune/demo/demo.yaml").resolve()
with contextlib.redirect_stdout(sys.stderr):
    engine = FinetuneEngine.from_yaml(cfg, config=FinetuneConfig(yaml_path=str(cfg), max_unit_ms=75.0, compile_layers=False, warm_up_units=False),
        overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": tempfile.mkdtemp()})
units = engine.units
engine._apply_window() if hasattr(engine, "_apply_window") else None
def copy_fn(f):
    return types.FunctionType(f.__code__.replace(co_name=f.__code__.co_name), f.__globals__, f.__name__ + "_copy", f.__defaults__, f.__closure__)
def make(spec):
    fn = copy_fn(cl._call_layer) if spec else cl._call_layer
    compiled = torch.compile(fn, dynamic=True, fullgraph=True, options={"cpp_wrapper": True})
    return compiled
rows = {}
for r, n in ((1, 4), (4, 96)):
    ids = torch.randint(0, 1000, (r, n))
    row = RowSlice(inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}, loss_denominator=torch.tensor(float(r*n)), num_tokens=r*n)
    units.embed(row)
    rows[(r, n)] = (row.hidden[0].detach(), cl.owned_mask(row.causal_mask, row.hidden[0]), row.position_ids, row.position_embeddings)
fns = {}
for spec in (False, True):
    with torch._dynamo.config.patch(specialize_float=spec):
        f = make(spec)
        for key, (h, m, p, pe) in rows.items():
            for layer in units.layers[:2]:
                with torch.no_grad(): f(layer, h, m, p, pe)
                with torch.enable_grad(): f(layer, h.requires_grad_(True), m, p, pe); h.requires_grad_(False)
    fns[spec] = f
fns["eager"] = cl.call_layer
res = {}
with torch.compiler.set_stance("fail_on_recompile"):
    for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
        for key, (h, m, p, pe) in rows.items():
            n = 30 if key[0] == 1 else 6
            for grad in (False, True):
                for spec in ((False, True, "eager") if rnd % 2 == 0 else ("eager", True, False)):
                    f = fns[spec]
                    hh = h.detach().requires_grad_(grad)
                    t = time.perf_counter()
                    with torch.set_grad_enabled(grad):
                        for i in range(n): f(units.layers[i % 30], hh, m, p, pe)
                    res.setdefault(f"{key[0]}x{key[1]} {'recompute' if grad else 'forward'} {spec if spec == 'eager' else ('spec' if spec else 'unspec')}", []).append((time.perf_counter() - t) / n * 1e3)
out = {k: {"median_ms": round(statistics.median(v), 3), "all": [round(x, 2) for x in v]} for k, v in sorted(res.items())}
print(json.dumps(out, indent=1))
if os.environ.get("HV_PROFILE"):
    import cProfile, pstats
    h, m, p, pe = rows[(1, 4)]
    for spec in (False, True):
        f = fns[spec]
        pr = cProfile.Profile()
        with torch.compiler.set_stance("fail_on_recompile"), torch.no_grad():
            pr.enable()
            for i in range(60): f(units.layers[i % 30], h, m, p, pe)
            pr.disable()
        st = pstats.Stats(pr, stream=sys.stdout); print("==== spec" if spec else "==== unspec"); st.sort_stats("tottime").print_stats(18)
