"""In-process A/B of plan+observe: versions loaded from two trees, alternated in chunks so host drift cancels.
usage: inproc.py TREE_A TREE_B  (prints per-step us for A, B, A' (a second instance of A) and ratios)"""
import importlib, random, sys, time
def load(tree):
    for m in [m for m in sys.modules if m == 'predictor' or m.startswith(('predictor.', 'base'))]:
        del sys.modules[m]
    sys.path.insert(0, tree)
    prof = importlib.import_module('predictor.profile'); sp = importlib.import_module('predictor.split_planner')
    sys.path.remove(tree)
    return prof.Profile.load(tree + '/predictor/profiles/synthetic-h100-llama3-8b.json'), sp.SplitPlanner
pa, A = load(sys.argv[1]); pb, B = load(sys.argv[2])
rng = random.Random(0)
shapes = [(rng.randint(1, 256), rng.randint(1, 4096), rng.random() < 0.9) for _ in range(4096)]
measured = [1.1 * rng.lognormvariate(0.0, 0.05) for _ in range(4096)]
planners = {'A': A(pa, 40.0), 'B': B(pb, 40.0), "A'": A(pa, 40.0)}
total = dict.fromkeys(planners, 0.0); counts = dict.fromkeys(planners, 0)
pos = dict.fromkeys(planners, 0)
CHUNK = 2000; ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 60
clock = time.perf_counter
for r in range(ROUNDS):
    order = list(planners) if r % 2 == 0 else list(planners)[::-1]
    for name in order:
        p = planners[name]; plan, observe = p.plan, p.observe; k0 = pos[name]
        t0 = clock()
        for k in range(k0, k0 + CHUNK):
            b, s, rr = shapes[k & 4095]
            d = plan(b, s, rr)
            observe(d, d.model_ms * measured[k & 4095])
        total[name] += clock() - t0; pos[name] += CHUNK; counts[name] += CHUNK
us = {n: total[n] / counts[n] * 1e6 for n in planners}
print(' '.join(f"{n}={v:.3f}us" for n, v in us.items()), f"B/A={us['B']/us['A']:.3f} A'/A={us[chr(65)+chr(39)]/us['A']:.3f}")
