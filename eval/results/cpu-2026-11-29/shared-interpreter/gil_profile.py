"""Sum a `py-spy record --gil -f raw` profile (samples only while some thread holds the interpreter lock): samples
per thread, then per function (inclusive: a sample counts once for each function on its stack) and per leaf.
`python gil_profile.py PROFILE.txt [N]`"""
import collections
import sys

threads, inclusive, leaves = collections.Counter(), collections.Counter(), collections.Counter()
total = 0
for line in open(sys.argv[1]):
    stack, n = line.rsplit(" ", 1)
    n = int(n)
    total += n
    frames = stack.split(";")
    if frames[0].startswith("thread ("):
        threads[frames[0]] += n
        frames = frames[1:]
    names = [f.split(" (")[0] for f in frames]
    for name in set(names):
        inclusive[name] += n
    leaves[names[-1] if names else "?"] += n
print("samples", total)
for k, v in threads.most_common():
    print(f"{v:5d} {k}")
print("--- inclusive")
for k, v in inclusive.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 45):
    print(f"{v:5d} {k}")
print("--- leaves")
for k, v in leaves.most_common(25):
    print(f"{v:5d} {k}")
