"""The per-thread sampler: every 5 s, each thread on the host: pid, tid, name, command line, CPU ticks and its
/proc/<pid>/task/<tid>/schedstat (ns on a core, ns waiting for one, timeslices); one JSON line per sample.
`python thread_sampler.py OUT.jsonl` (runs until killed)."""
import json, os, sys, time
out = open(sys.argv[1], "a")
while True:
    rows = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")[:120].decode(errors="replace")
            for tid in os.listdir(f"/proc/{pid}/task"):
                f = open(f"/proc/{pid}/task/{tid}/stat").read()
                comm = f[f.index("(") + 1:f.rindex(")")]
                rest = f[f.rindex(")") + 2:].split()
                sched = [int(x) for x in open(f"/proc/{pid}/task/{tid}/schedstat").read().split()]
                rows.append([int(pid), int(tid), comm, cmd, int(rest[11]) + int(rest[12]), *sched])
        except (OSError, ValueError):
            pass
    out.write(json.dumps({"t": time.time(), "rows": rows}) + "\n"); out.flush()
    time.sleep(5)
