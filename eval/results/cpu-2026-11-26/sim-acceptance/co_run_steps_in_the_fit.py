import sys
from harvest.colocation import controller as c
orig = c.Controller.after_step
def after_step(self, step, kv_demand_slots=0):
    if self._decision_co_ran():
        self.batch_cost.observe(step.batch_size, step.latency_ms)
    return orig(self, step, kv_demand_slots)
c.Controller.after_step = after_step
from harvest.cli.main import main
trace, noise = sys.argv[1], sys.argv[2]
sys.argv = ["harvest", "replay", "--trace", trace, "--simulate", "--latency-noise", noise, "--out", f"/tmp/sim26/p2-{trace}-{noise}"]
main()
