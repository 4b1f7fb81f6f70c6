import json, math, statistics as st, collections, sys
d = json.load(open(sys.argv[1]))
by = collections.defaultdict(list)
for kind, n, dur, pred in d["observe"]:
    if pred and n > 0: by[kind].append(math.log(dur / pred))
for k, xs in by.items():
    xs2 = xs[len(xs)//4:]
    if len(xs2) < 3: continue
    s = sorted(xs2)
    q = lambda p: math.exp(s[int(p*(len(s)-1))])
    print(k, len(xs2), "gmean", round(math.exp(st.mean(xs2)),3), "std", round(st.stdev(xs2),3), "q50 %.2f q90 %.2f q99 %.2f max %.2f" % (q(.5), q(.9), q(.99), q(1)), "exp(m+2.33s) %.2f exp(m+3.09s) %.2f" % (math.exp(st.mean(xs2)+2.33*st.stdev(xs2)), math.exp(st.mean(xs2)+3.09*st.stdev(xs2))))
u = d["units"]; n0 = len(u)//4
c = collections.Counter(k for k, dur, _ in u[n0:] if dur > 18.6)
tot = collections.Counter(k for k, dur, _ in u[n0:])
print("over", dict(c), "of", dict(tot))
