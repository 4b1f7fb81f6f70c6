import json,sys,glob,statistics as st,collections
for d in sys.argv[1:]:
    try: out=json.load(open(d+".out"))
    except Exception: continue
    for r in out['runs']:
        s=json.load(open(r['step_records']))
        bs=collections.defaultdict(list)
        for x in s:
            if x['ft_sms']: bs[x['batch_size']].append(x['latency_ms'])
        ws=json.load(open(r['step_records'].replace('steps-','worker_stats-')))
        co=ws['colocation'].get('co_run')
        print(d.split('/')[-1], r['window'], 'host',r['host']['decode_loop_ms']['1'], 'in',round(r['steps_within_target'],4), 'tok/s',r['finetune_tokens_per_s'], 'corun',r['co_run_tokens_per_s'],
              {b:round(st.median(v)) for b,v in sorted(bs.items()) if len(v)>=5})
