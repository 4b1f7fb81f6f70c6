"""Simulated replay on the shipped core profile under load: decode alone (separate) vs harvest, per seed.
Run from a tree (its harvest is what is measured): python loaded_cpu.py OUT.jsonl SPEC [SPEC ...]"""
import json, sys, time
sys.path.insert(0, '.')
from harvest.replay.replay_config import DeviceMemory, ReplayConfig
from harvest.replay.replay_simulation import ReplaySimulation
from predictor import Profile
from traces.trace_loader import load_trace

profile = Profile.load('predictor/profiles/cpu-cores-smollm2-135m.json')
config = ReplayConfig(tpot_slo_ms=300.0, latency_noise=0.1, policies=("separate", "harvest"))
with open(sys.argv[1], "a") as out:
    for spec in sys.argv[2:]:
        for seed in range(4):
            started = time.time()
            trace = load_trace(f"{spec},duration=1200,seed={seed}").cap_lengths(512, 64)
            r = ReplaySimulation(profile, DeviceMemory.for_profile(profile), config).run(trace)
            row = {"trace": spec, "seed": seed, "wall_s": round(time.time() - started, 1)}
            for name in ("separate", "harvest"):
                p = r["policies"][name]
                row[name] = {"attainment": p["decode"]["step_slo_attainment"], "mean_batch": p["decode"]["mean_batch_size"],
                             "num_steps": p["decode"]["num_steps"],
                             "decode_device_ft_tokens_per_s": p["finetune"]["decode_device_tokens_per_s"]}
            out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
