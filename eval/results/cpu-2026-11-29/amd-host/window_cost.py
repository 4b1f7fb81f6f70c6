"""Per-unit cost of the window bookkeeping (_apply_window) on the demo job, one torch thread."""
import contextlib, json, sys, tempfile, time
from pathlib import Path
import torch
from harvest.finetune import FinetuneConfig, FinetuneEngine
torch.set_num_threads(1)
cfg = Path("harvest/finetune/demo/demo.yaml").resolve()
with contextlib.redirect_stdout(sys.stderr):
    engine = FinetuneEngine.from_yaml(cfg, config=FinetuneConfig(yaml_path=str(cfg), max_unit_ms=75.0),
        overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": tempfile.mkdtemp()})
engine.run_step()
for _ in range(7): engine.run_next_unit()
print("window layers", engine._num_window_layers, "upcoming", len(list(engine._queue.upcoming_layer_ids())))
res = []
for r in range(5):
    t = time.perf_counter(); n = 2000
    for _ in range(n): engine._apply_window()
    res.append((time.perf_counter() - t) / n * 1e6)
print(json.dumps({"apply_window_us": [round(x, 1) for x in res]}))
