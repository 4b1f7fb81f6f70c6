"""Per run: over the samples while the unit thread lived (the replay on (1, 1)), the share of wall time the
scheduler thread and the unit thread ran on a core, waited for one (run queue), or slept (neither: the
interpreter lock, or nothing to do), from /proc/<pid>/task/<tid>/schedstat. `python shares.py RUN.procs.jsonl...`"""
import json, sys
for path in sys.argv[1:]:
    lines = [json.loads(l) for l in open(path)]
    live = [l for l in lines if any(r[2] == "harvest-finetun" for r in l["rows"])]
    if len(live) < 3:
        print(path, "no unit thread seen"); continue
    a, b = live[1], live[-1]  # the first sample may catch the thread's start
    dt = (b["t"] - a["t"]) * 1e9
    first = {(r[0], r[1]): r for r in a["rows"]}
    main = next(r for r in b["rows"] if r[2] == "sglang::schedul" and r[0] == r[1])
    unit = next(r for r in b["rows"] if r[2] == "harvest-finetun")
    out = {"run": path.split("/")[-1].split(".")[0], "span_s": round(dt / 1e9, 1)}
    for name, r in (("scheduler", main), ("units", unit)):
        f = first[(r[0], r[1])]
        run, runq = (r[5] - f[5]) / dt, (r[6] - f[6]) / dt
        out[name] = {"on_core": round(run, 3), "run_queue": round(runq, 3), "asleep": round(1 - run - runq, 3)}
    print(json.dumps(out))
