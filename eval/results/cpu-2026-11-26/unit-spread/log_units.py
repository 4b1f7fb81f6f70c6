import json, sys, time, torch
from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.unit_sizer import UnitSizer
log = []
orig = UnitSizer.observe
def observe(self, kind, num_tokens, duration_ms):
    c = self.cost(kind) if self._ms.get(kind) else None
    pred = None if c is None else c[0] + c[1] * num_tokens
    log.append((kind, num_tokens, duration_ms, pred))
    return orig(self, kind, num_tokens, duration_ms)
UnitSizer.observe = observe
torch.set_num_threads(2)
y = "harvest/finetune/demo/demo.yaml"
e = FinetuneEngine.from_yaml(y, config=FinetuneConfig(yaml_path=y, max_unit_ms=18.6), overrides={"max_steps": 10**6, "save_steps": 10**9})
units = []
for _ in range(int(sys.argv[1])):
    while True:
        r = e.run_next_unit(); units.append((r.kind, r.duration_ms, r.num_trained_tokens))
        if r.is_step_end: break
json.dump({"observe": log, "units": units}, open(sys.argv[2], "w"))
