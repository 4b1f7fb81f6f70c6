import os, threading, time, torch
print("torch", torch.__version__, torch.__config__.parallel_info().splitlines()[:6])
a = torch.randn(512, 512)
def bench(n=40):
    t=time.perf_counter()
    for _ in range(n): a@a
    return (time.perf_counter()-t)*1e3/n
torch.set_num_threads(2)
print("main 2 threads", torch.get_num_threads(), round(bench(),2), "ms")
res = {}
def worker(core, name):
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    res[name+"_threads"] = torch.get_num_threads()
    res[name+"_ms"] = round(bench(),2)
    res[name+"_aff"] = os.sched_getaffinity(0)
t = threading.Thread(target=worker, args=(1, "t1")); t.start(); t.join()
print("after thread: main threads", torch.get_num_threads(), "aff", os.sched_getaffinity(0), res)
print("main again", round(bench(),2))
# concurrent
res.clear()
ts=[threading.Thread(target=worker, args=(c, f"c{c}")) for c in (0,1)]
[x.start() for x in ts]; [x.join() for x in ts]
print("concurrent 1+1", res)
os.sched_setaffinity(0, {0,1})
