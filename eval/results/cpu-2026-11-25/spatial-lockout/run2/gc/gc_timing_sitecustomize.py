import gc, os, time, threading
_start = {}
_stats = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
_f = None
def _cb(phase, info):
    global _f
    g = info["generation"]
    if phase == "start":
        _start[g] = time.perf_counter()
        return
    ms = (time.perf_counter() - _start.get(g, time.perf_counter())) * 1e3
    st = _stats[g]; st[0] += 1; st[1] += ms
    if ms > 5 or st[0] % 200 == 0:
        if _f is None:
            _f = open(f"/tmp/exp/gc/{os.getpid()}.txt", "a", buffering=1)
        _f.write(f"{time.time():.3f} gen{g} {ms:.1f}ms thread={threading.current_thread().name} n={st[0]} total={st[1]:.0f}ms collected={info.get('collected')}\n")
gc.callbacks.append(_cb)
