"""Each replay window's steps from a worker's steps.json (bounded by its results.json's end and wall time): steps per
partition, decode step latency by partition and batch bucket, the steps over 40 ms. Run from a folder holding
run1/x and run2/x, the .tgz files unpacked (tar xzf run1/spatial.tgz -C run1/x ...)."""
import json, glob, statistics, datetime, collections
def load(d):
    steps=json.load(open(f'{d}/steps.json'))['steps']
    out=[]
    for f in sorted(glob.glob(f'{d}/scale-*/results.json')):
        r=json.load(open(f)); end=datetime.datetime.strptime(r['created_utc'],'%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.timezone.utc).timestamp()
        start=end-r['wall_s']
        w=[s for s in steps if start<=s['end_s']<=end+1]
        out.append((f.split('/')[-2], w))
    return out
for d in ['run1/x/spatial','run1/x/temporal','run2/x/temporal']:
    for name,w in load(d):
        if not w: print(d,name,'no steps'); continue
        parts=collections.Counter((s['ft_sms'],s['infer_sms']) for s in w)
        print(d, name, len(w), 'steps; partitions', dict(parts), 'ft tokens', sum(s['finetune_tokens'] for s in w), 'ft_ms', round(sum(s['finetune_ms'] for s in w)), 'idle_wait max', max(s['idle_wait_ms'] for s in w), 'preempt max', max(s['preempt_ms'] for s in w))
        byb=collections.defaultdict(list)
        for s in w:
            b=s['batch_size']; k=(s['infer_sms'], 1 if b<=2 else 4 if b<=8 else 16 if b<=16 else 32 if b<=32 else 64)
            byb[k].append(s['latency_ms'])
        for k in sorted(byb): print('   ', k, len(byb[k]), 'p50', round(statistics.median(byb[k]),2), 'max', round(max(byb[k]),1))
        over=[s for s in w if s['latency_ms']>40]
        for s in over: print('    over:', s['batch_size'], s['latency_ms'], s['infer_sms'], s['finetune_ms'], s['overrun_ms'], s['planned_ms'], s['preempt_ms'])
