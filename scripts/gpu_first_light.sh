#!/usr/bin/env bash
# harvest on a lent GPU: one prepared run that fits 10 minutes of wall time on one H100, the install
# included, carried in one device call (the checkout and the bundle's parts <= 63 MiB).
#
#   scripts/gpu_first_light.sh [--dry-run] [--bundle DIR] [--budget-s N] [--only NAME,...]
#                              [--window 30s|0] [--alone-s 20] [--rate-scales 1[,K...]]
#
# Stages, in the order that leaves results when the run is cut off: facts -> install -> native build (after
# the install: the driver stub's symbols come from sgl_kernel) -> model make (Llama-3.2-1B shape, random
# weights) -> decision cost (plan + observe on this host's CPU) -> a --window conv replay on the default worker
# (spatial, the split chosen live between the whole device and the even split; first, as it never ran on a GPU
# before 2026-11-30; 64,56 pinned ran on 2026-11-28) -> temporal worker with the job: --alone-s with no
# requests (the job in idle turns; 0: none), then the replay (--window 0: none, the job alone only) -> solo
# decode profile of the served model -> doctor -> interference check. A worker replays the window once per
# --rate-scales entry, in order, on the one worker (a start costs 70-160 s of the lease, a replay ~40), each
# replay --window (seconds) of wall time: at rate scale k, k times that much of the trace.
# Each stage runs under `timeout` (its cap, or what is left of --budget-s) and writes into $OUT as it
# finishes; only $OUT comes back from a lent GPU, at most 8 files: facts.json, stages.log, decision.json,
# temporal.tgz, spatial.tgz, profile.tgz, doctor.jsonl, interference.jsonl. --only runs the named stages
# alone (a rerun of one). Nothing is written outside $OUT and the checkout: work files, HOME and TMPDIR (so
# the JIT caches too) live in .first-light/. A copy of the checkout without .git
# names its commit with HARVEST_COMMIT=... (facts.json).
# --dry-run (CPU, CI) checks every harvest command line against the real parsers (scripts/check_argv.py)
# and, given a bundle, that it is whole and that the carry fits one call.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0; bundle=bundle; budget_s=560; only=""; window=30s; alone_s=20; rate_scales=1
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --bundle) bundle=$2; shift ;;
    --budget-s) budget_s=$2; shift ;;
    --only) only=",$2,"; shift ;;
    --window) window=$2; shift ;;
    --alone-s) alone_s=$2; shift ;;
    --rate-scales) rate_scales=$2; shift ;;
    *) echo "gpu_first_light.sh: error: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

export repo=$PWD
export work=$repo/.first-light
export out=${OUT:-$work/out}
export site=$work/site model=$work/llama3.2-1b job=$work/job.yaml bundle
export python=${PYTHON:-python3}
export tpot_ms=40 port=30000 admin_port=30100 profile_port=30010 profile_admin_port=30110 window alone_s rate_scales
export scale=1  # the replay's rate scale, set per replay by run_worker
export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH" PYTHONUNBUFFERED=1 \
       HF_HUB_OFFLINE=1 PIP_NO_CACHE_DIR=1
CARRY_LIMIT_BYTES=$((63 * 1024 * 1024))  # the device call's 64 MiB, less room for untracked files
mkdir -p "$work/home" "$work/tmp"
export HOME=$work/home TMPDIR=$work/tmp XDG_CACHE_HOME=$work/home/.cache TRITON_CACHE_DIR=$work/home/.triton/cache

# name, cap in seconds, what it does; a worker's cap holds a cold start to serving (161 s on an H200), the job's
# first step (~40 s more), --alone-s and the replay (eval/results/2026-11-27-h200-2/)
STAGES=(
  "facts 20 GPU, driver, CUDA, cuda-bindings, nvcc, commit -> facts.json"
  "install 120 the bundle installed offline into .first-light/site"
  "native 90 csrc/ built here (the CUDA VMM backend with nvcc; the stub's symbols come from the installed sgl_kernel)"
  "model 60 random Llama-3.2-1B (bf16, drawn on the GPU) with a small tokenizer, and the LoRA job"
  "decision 30 plan + observe on this host's CPU (harvest bench predictor, the synthetic H100 profile) -> decision.json"
  "spatial 330 the default worker with the job (spatial, the split chosen live), once it runs a --window conv replay per rate scale -> spatial.tgz"
  "temporal 330 temporal worker with the job, once it runs --alone-s alone then a --window conv replay per rate scale -> temporal.tgz"
  "profile 200 harvest profile, solo: decode shapes of the served model, held-out error -> profile.tgz"
  "doctor 100 harvest doctor, every check but the interference one -> doctor.jsonl"
  "interference 40 decode beside a saturating finetune partition, %smid confinement -> interference.jsonl"
)
HARVEST_COMMANDS=(doctor model decision serve_temporal replay_temporal serve_spatial replay_spatial profile interference)

hv() { "$python" -m harvest.cli.main "$@"; }

argv_for() {  # sets ARGV: the harvest command line of $1
  case "$1" in
    doctor) ARGV=(doctor --json --only "$("$python" -c "from harvest.doctor import CHECKS
print(','.join(c.name for c in CHECKS if c.name != 'gpu_interference'))")") ;;
    model) ARGV=(model make --shape llama3.2-1b --random --dtype bf16 --device cuda --tokenizer small --out "$model") ;;
    # A small graph batch cap: start-up in seconds, not the minutes SGLang's default (256 on an H100) takes.
    serve_temporal|serve_spatial)
      ARGV=(serve --model-path "$model" --finetune "$job" --tpot-slo-ms "$tpot_ms" --port "$port"
            --admin-port "$admin_port" --mem-fraction-static 0.6 --cuda-graph-max-bs 16 --grammar-backend none)
      [ "$1" = serve_temporal ] && ARGV+=(--colocation temporal) ;;
    replay_temporal|replay_spatial)
      # k times the window's trace at rate scale k: every replay lasts --window of wall time
      ARGV=(replay --trace conv --window "$(awk "BEGIN {print ${window%s} * $scale}")s" --rate-scale "$scale"
            --target "http://127.0.0.1:$port"
            --admin "http://127.0.0.1:$admin_port" --tpot-ms "$tpot_ms" --drain-s 20
            --out "$work/${1#replay_}/scale-$scale" --no-plots) ;;
    interference) ARGV=(doctor --json --only gpu_interference,gpu_confine) ;;
    decision) ARGV=(bench predictor --profile predictor/profiles/synthetic-h100-llama3-8b.json --tpot-ms "$tpot_ms") ;;
    # Decode shapes only (the temporal stage measures the job alone); one pass and few held-out shapes: the
    # stage's time, after the two workers.
    profile) ARGV=(profile --model-path "$model" --out "$work/profile/profile.json" --port "$profile_port"
                   --admin-port "$profile_admin_port" --max-batch-size 16 --seq-levels 2 --passes 1 --held-out 4) ;;
  esac
}

http_get() {  # $1 URL -> stdout; fails if it does not answer 200
  "$python" -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" "$1"
}

free_ports() {  # [PORT...] kill what still listens on them (the worker's), with its tree: a worker outlives a stage cut
  # short by `timeout` (it drains and checkpoints its job once its supervisor is gone), and the next stage's
  # health check would reach it instead of its own worker (the H100 run of 2026-11-27)
  local ports=("$@")
  [ $# -gt 0 ] || ports=("$port" "$admin_port")
  "$python" - "${ports[@]}" <<'EOF'
import sys, psutil
ports = {int(p) for p in sys.argv[1:]}
owners = {c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port in ports and c.pid}
procs = [p for pid in owners for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]]
for p in procs:
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass
psutil.wait_procs(procs, timeout=10)
print(f"free_ports: killed {len(procs)} process(es) on {sorted(ports)}" if procs else "", end="")
EOF
}

dump_stacks() {  # every thread's stack of the worker's scheduler into worker.log (hooks.py registers SIGUSR2)
  "$python" - "$1" <<'EOF2'
import signal, sys, psutil
for p in psutil.Process(int(sys.argv[1])).children(recursive=True):
    try:
        if "sglang::scheduler" in " ".join(p.cmdline()):
            p.send_signal(signal.SIGUSR2)
            print(f"dump_stacks: SIGUSR2 to {p.pid}")
    except psutil.Error:
        pass
EOF2
}

kick_request() {  # one 4-token request with its prompt prefilled (what the replay sends), logged with its time
  "$python" - "http://127.0.0.1:$port" <<'EOF4'
import sys, time, httpx
from harvest.worker.client import prefilled_request
started = time.time()
reply = httpx.post(f"{sys.argv[1]}/generate", json=prefilled_request([1, 2, 3, 4], 4, room=0), timeout=30)
print(f"kick_request: {reply.status_code} at {time.strftime('%H:%M:%S', time.gmtime(started))} in {time.time() - started:.2f} s")
EOF4
}

run_worker() {  # $1 temporal|spatial: a worker with the job, the job alone, a replay per rate scale, its stats and step records
  local dir=$work/$1 pid poller rc=1 i left
  rm -rf "$dir" && mkdir -p "$dir"
  free_ports
  argv_for "serve_$1"
  hv "${ARGV[@]}" >"$dir/worker.log" 2>&1 &
  pid=$!
  for i in $(seq 230); do
    http_get "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "worker exited before serving (worker.log)"; return 1; }
    sleep 1
  done
  echo "$1: serving after $(( $(date +%s) - stage_start ))s"
  # The replay measures the job at work, not its engine being built (run 3 of 2026-11-27: the first 15-30 s).
  # A job still building 30 s after serving gets its stacks dumped, twice 10 s apart (stuck, or slow?), and at
  # 45 s one short request (does a step free it?): so a late job of eval/results/2026-11-27-h200-3/ was traced
  # to SGLang's spinning idle loop. tail_s: what the stage keeps after the job alone (replay and drain).
  local serving=$(date +%s) acts=(30 40 45) since tail_s=75 job_state="not running"
  [ "$window" = 0 ] && tail_s=25
  while [ $(( stage_deadline - $(date +%s) )) -gt $tail_s ]; do
    http_get "http://127.0.0.1:$admin_port/harvest/stats" 2>/dev/null | "$python" -c \
      "import json, sys; sys.exit(json.load(sys.stdin)['finetune'].get('state') != 'running')" && {
      job_state=running; break; }
    since=$(( $(date +%s) - serving ))
    if [ ${#acts[@]} -gt 0 ] && [ $since -ge ${acts[0]} ]; then
      if [ ${#acts[@]} -gt 1 ]; then dump_stacks $pid
      else echo "$1: job not running ${since}s after serving: one request"; kick_request; fi
      acts=("${acts[@]:1}")
    fi
    sleep 1
  done
  echo "$1: job $job_state after $(( $(date +%s) - stage_start ))s"  # not running: the wait ran out
  # The job with no requests, in the idle turns of a temporal worker (temporal only: time)
  if [ "$1" = temporal ] && [ "$alone_s" != 0 ] && [ $(( stage_deadline - $(date +%s) )) -gt $(( tail_s + alone_s )) ]; then
    "$python" - "http://127.0.0.1:$admin_port/harvest/stats" "$alone_s" >"$dir/alone.json" <<'EOF3'
import json, sys, time, urllib.request

def finetune():
    return json.load(urllib.request.urlopen(sys.argv[1], timeout=10))["finetune"], time.monotonic()

(a, t0), _ = finetune(), time.sleep(float(sys.argv[2]))
b, t1 = finetune()
print(json.dumps({"seconds": round(t1 - t0, 2), "tokens": b["tokens"] - a["tokens"], "steps": b.get("step", 0) - a.get("step", 0),
                  "tokens_per_s": round((b["tokens"] - a["tokens"]) / (t1 - t0), 1), "state": b["state"]}))
EOF3
    echo "$1: alone $(cat "$dir/alone.json")"
  fi
  # A snapshot of the stats every 5 s: what the worker did even if the replay never ends (run 2 of 2026-11-27)
  ( while kill -0 $pid 2>/dev/null; do
      echo "{\"t\": $(date +%s), \"stats\": $(http_get "http://127.0.0.1:$admin_port/harvest/stats" 2>/dev/null | tr -d "\n" || echo null)}"
      sleep 5
    done >"$dir/stats.jsonl" ) &
  poller=$!
  # Each replay ends 30 s before the stage's deadline, leaving time for the stacks, the stats and the drain
  rc=0
  if [ "$window" != 0 ]; then
    for scale in ${rate_scales//,/ }; do
      left=$(( stage_deadline - $(date +%s) - 30 ))
      [ $left -gt 20 ] || { echo "$1: replay at rate scale $scale skipped: ${left}s left"; break; }
      argv_for "replay_$1"
      timeout -k 5 $left "$python" -m harvest.cli.main "${ARGV[@]}" >"$dir/replay-$scale.log" 2>&1
      rc=$?
      echo "$1: replay at rate scale $scale rc=$rc after $(( $(date +%s) - stage_start ))s"
      [ $rc = 0 ] || { [ $rc = 124 ] && { dump_stacks $pid; sleep 3; }; break; }
    done
  fi
  http_get "http://127.0.0.1:$admin_port/harvest/stats" >"$dir/stats.json"
  http_get "http://127.0.0.1:$admin_port/harvest/steps?limit=10000" >"$dir/steps.json"
  kill $poller 2>/dev/null
  kill -TERM $pid 2>/dev/null
  for i in $(seq 15); do kill -0 $pid 2>/dev/null || break; sleep 1; done
  kill -KILL $pid 2>/dev/null
  return $rc
}

stage_facts() {
  "$python" - "$out/facts.json" <<'EOF'
import importlib.metadata, json, os, subprocess, sys

def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}"

def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None

facts = {"gpu": run("nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader"),
         "nvcc": next((line for line in run("nvcc", "--version").splitlines() if "release" in line), None),
         "commit": os.environ.get("HARVEST_COMMIT") or run("git", "-C", os.environ["repo"], "rev-parse", "HEAD"),
         "python": sys.version.split()[0],
         **{name: version(name) for name in ("torch", "triton", "cuda-bindings", "apache-tvm-ffi", "transformers")}}
try:
    import torch
    facts["torch_cuda"] = torch.version.cuda
    facts["device"] = torch.cuda.get_device_name(0)
    facts["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
except Exception as e:  # the facts say what failed
    facts["torch_error"] = f"{type(e).__name__}: {e}"
open(sys.argv[1], "w").write(json.dumps(facts, indent=1) + "\n")
print(json.dumps(facts))
EOF
}

stage_native() { make -s -C csrc OUT="$repo/build/native" PYTHON="$python"; }

stage_doctor() { argv_for doctor; hv "${ARGV[@]}" >"$out/doctor.jsonl"; }

stage_install() { "$python" "$bundle/install_bundle.py" --target "$site"; }

stage_model() {
  argv_for model
  rm -rf "$model" && hv "${ARGV[@]}" && "$python" - "$model" "$work/adapter" "$job" <<'EOF'
import sys, yaml
from harvest.finetune.demo.tiny_job import TINY_JOB
job = {**TINY_JOB, "model_name_or_path": sys.argv[1], "output_dir": sys.argv[2], "max_steps": 1000,
       "per_device_train_batch_size": 4, "cutoff_len": 256, "max_samples": 512, "save_steps": 1000}
open(sys.argv[3], "w").write(yaml.safe_dump(job))
EOF
}

stage_temporal() { run_worker temporal; }

stage_spatial() { run_worker spatial; }

stage_interference() { argv_for interference; hv "${ARGV[@]}" >"$out/interference.jsonl"; }

stage_decision() { argv_for decision; hv "${ARGV[@]}" >"$out/decision.json"; }

stage_profile() {
  rm -rf "$work/profile" && mkdir -p "$work/profile"
  argv_for profile
  hv "${ARGV[@]}" >"$work/profile/summary.json" 2>"$work/profile/profile.log"
}

pack_run() {  # $1 temporal|spatial|profile: what the stage left, whatever its outcome, into $OUT/$1.tgz
  [ -d "$work/$1" ] || return 0
  tail -c 2000000 "$work/$1/worker.log" >"$work/$1/worker.log.tail" 2>/dev/null
  tar czf "$out/$1.tgz" -C "$work" --exclude worker.log "$1"
}

carry_bytes() {  # the checkout's tracked files and the bundle: what one device call carries
  local tree bundle_bytes=0
  tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  [ -d "$bundle" ] && bundle_bytes=$(find "$bundle" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  echo $((tree + bundle_bytes))
}

dry_run_checks() {  # prints what is wrong; returns how many
  local missing=0 name bytes
  for name in "${HARVEST_COMMANDS[@]}"; do
    argv_for "$name"
    printf 'harvest'; printf ' %q' "${ARGV[@]}"; printf '\n'
  done | "$python" scripts/check_argv.py || missing=$((missing + 1))
  if [ -f "$bundle/manifest.json" ] && [ -f "$bundle/install_bundle.py" ]; then
    for name in $("$python" -c "import json,sys; print(' '.join(p['name'] for p in json.load(open(sys.argv[1]))['parts']))" "$bundle/manifest.json"); do
      [ -f "$bundle/$name" ] || { echo "MISSING: $bundle/$name (the install stage needs every part in one call)"; missing=$((missing + 1)); }
    done
  else
    echo "note: no bundle in $bundle (harvest bundle --out $bundle); the install stage needs one, carried"
  fi
  bytes=$(carry_bytes)
  echo "carry: $bytes bytes (tracked tree + $bundle), limit $CARRY_LIMIT_BYTES"
  [ "$bytes" -le $CARRY_LIMIT_BYTES ] || { echo "TOO BIG: the carry exceeds one device call"; missing=$((missing + 1)); }
  return $missing
}

if [ $dry_run = 1 ]; then
  total=0
  for entry in "${STAGES[@]}"; do
    read -r name secs desc <<<"$entry"
    printf '  %-13s <= %3ss  %s\n' "$name" "$secs" "$desc"; total=$((total + secs))
  done
  echo "caps add up to ${total}s; the run stops at --budget-s ${budget_s}s"
  dry_run_checks; missing=$?
  echo "dry run: $missing problem(s)"
  exit $((missing > 0))
fi

mkdir -p "$out"
export -f hv argv_for http_get free_ports dump_stacks kick_request run_worker $(for e in "${STAGES[@]}"; do echo "stage_${e%% *}"; done)
started=$(date +%s)
for entry in "${STAGES[@]}"; do
  read -r name cap desc <<<"$entry"
  [ -n "$only" ] && [[ "$only" != *",$name,"* ]] && continue
  left=$((budget_s - ($(date +%s) - started)))
  if [ "$left" -lt 15 ]; then echo "$name skipped: ${left}s left of --budget-s" | tee -a "$out/stages.log"; continue; fi
  limit=$((cap < left ? cap : left))
  echo "== $name (<= ${limit}s): $desc" | tee -a "$out/stages.log"
  t0=$(date +%s); export stage_start=$t0 stage_deadline=$((t0 + limit))
  timeout -k 5 "$limit" bash -c "stage_$name" >>"$out/stages.log" 2>&1
  rc=$?
  case "$name" in
    temporal|spatial) pack_run "$name"; free_ports >>"$out/stages.log" 2>&1 ;;
    # The profile's worker logs into its own temporary folder (harvest profile's summary names it)
    profile) log=$(ls -d "$TMPDIR"/harvest-profile-*/worker.log 2>/dev/null | tail -1)
             [ -n "$log" ] && ln -sf "$log" "$work/profile/worker.log"
             pack_run profile; free_ports "$profile_port" "$profile_admin_port" >>"$out/stages.log" 2>&1 ;;
  esac
  echo "== $name rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$out/stages.log"
done
echo "first light done in $(( $(date +%s) - started ))s: $out"
