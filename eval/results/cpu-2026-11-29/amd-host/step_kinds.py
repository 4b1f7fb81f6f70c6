"""Where a harvest row's steps went: beside the job on a partition, on the whole device with a slice after, or on the
whole device with none (the job trained nothing then). Usage: python step_kinds.py STEPS_JSON..."""
import json
import sys

for path in sys.argv[1:]:
    steps = json.load(open(path))
    co_run = [s for s in steps if s["ft_sms"]]
    sliced = [s for s in steps if not s["ft_sms"] and s["finetune_ms"] > 0]
    bare = [s for s in steps if not s["ft_sms"] and s["finetune_ms"] == 0]
    span_s = steps[-1]["end_s"] - steps[0]["end_s"]
    print(json.dumps({"steps": path, "num_steps": len(steps), "co_run": len(co_run), "whole_with_slice": len(sliced),
                      "whole_without_slice": len(bare), "whole_without_slice_s": round(sum(s["latency_ms"] for s in bare) / 1e3, 1),
                      "span_s": round(span_s, 1)}))
