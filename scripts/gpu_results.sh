#!/usr/bin/env bash
# The GPU results of harvest on an air-gapped GPU host, stage by stage.
#
#   scripts/gpu_results.sh [--dry-run] [--bundle DIR] [--parts-from DIR]... [--site DIR] [--work DIR]
#                          [--budget-s N] [--only STAGE]
#
# Runs the stages not yet done, in order, each under `timeout` (< 10 minutes), and stops before a stage whose
# usual duration no longer fits --budget-s (default 540, one device command). Run it again to resume: a stage
# leaves WORK/stages/NAME.done when it succeeds. --dry-run prints the stages and checks the inputs.
# Results land in eval/results/<date>-<gpu>/ (device, driver and commit in its README.md; a copy of the
# checkout without .git names its commit with HARVEST_COMMIT=...).
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0; bundle=bundle; parts_from=(); site=/var/tmp/harvest-site; work=/var/tmp/harvest-work
budget_s=540; only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --bundle) bundle=$2; shift ;;
    --parts-from) parts_from+=(--parts-from "$2"); shift ;;
    --site) site=$2; shift ;;
    --work) work=$2; shift ;;
    --budget-s) budget_s=$2; shift ;;
    --only) only=$2; shift ;;
    *) echo "gpu_results.sh: error: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH" HF_HUB_OFFLINE=1
harvest=${HARVEST:-harvest}
python=${PYTHON:-python3}
model=$work/llama3-8b
job=$work/job.yaml
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
results=${RESULTS:-eval/results/$(date -u +%Y-%m-%d)-${gpu:-nogpu}}
tpot_ms=40
mkdir -p "$work/stages"

# name, usual seconds (estimates until measured; 1470 s in all, inside 25 minutes of device time), description
STAGES=(
  "install 120 install the bundle offline into --site"
  "doctor 30 harvest doctor: driver, GPU, SGLang, native libraries"
  "model 90 random Llama-3-8B (bf16, drawn on the GPU) with a small tokenizer for the LoRA job"
  "profile_solo 240 decode latency profile + the LoRA job's solo throughput"
  "worker_temporal 180 live conv-trace window at 40 ms TPOT, LoRA job inside, temporal (solo profile)"
  "profile_corun 360 co-run profile: solo and co-run decode per green-context partition, finetune per partition"
  "worker_spatial 180 live conv-trace window at 40 ms TPOT, LoRA job inside, spatial (co-run profile)"
  "baselines 60 separate / static / temporal / harvest replayed on the measured profile"
  "finetune_off 180 harvest with finetuning off vs plain SGLang, same requests"
  "report 30 results README: device, driver, commit, tables"
)

hv() { $harvest "$@"; }

serve_and_replay() {  # $1 out dir, $2 profile; a live replay against a worker with the LoRA job inside
  local out=$1 profile=$2 port=30000 admin=30100 pid
  mkdir -p "$out"
  hv serve --model-path "$model" --finetune "$job" --tpot-slo-ms $tpot_ms --profile "$profile" \
    --port $port --admin-port $admin --mem-fraction-static 0.8 --grammar-backend none >"$out/worker.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  hv replay --trace conv --window 60s --target "http://127.0.0.1:$port" --admin "http://127.0.0.1:$admin" \
    --tpot-ms $tpot_ms --out "$out"
  local rc=$?
  kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
  return $rc
}

run_stage() {
  case "$1" in
    install) $python "$bundle/install_bundle.py" --target "$site" "${parts_from[@]}" ;;
    doctor) mkdir -p "$results" && hv doctor | tee "$results/doctor.txt" ;;
    model)
      rm -rf "$model" && hv model make --shape llama3-8b --random --dtype bf16 --device cuda --tokenizer small \
        --out "$model" | tee "$work/model.json" &&
      $python -c "
import sys, yaml
from harvest.finetune.demo.tiny_job import TINY_JOB
job = {**TINY_JOB, 'model_name_or_path': sys.argv[1], 'output_dir': sys.argv[2], 'max_steps': 1000,
       'per_device_train_batch_size': 4, 'cutoff_len': 256, 'max_samples': 512, 'save_steps': 1000}
open(sys.argv[3], 'w').write(yaml.safe_dump(job))" "$model" "$work/adapter" "$job" ;;
    profile_solo) hv profile --model-path "$model" --finetune "$job" --out "$results/profile_solo.json" ;;
    worker_temporal) serve_and_replay "$results/worker_temporal" "$results/profile_solo.json" ;;
    # Every SM partition the driver's split forms is sampled (17 decode sides on an H100, ~340 visits at
    # these settings): one pass, two seq_len levels, one held-out shape per partition fit the stage's time.
    profile_corun) hv profile --co-run --model-path "$model" --finetune "$job" --out "$results/profile_corun.json" \
                     --max-batch-size 16 --max-seq-len 1024 --seq-levels 2 --passes 1 --held-out 1 \
                     --finetune-steps 2 ;;
    worker_spatial) serve_and_replay "$results/worker_spatial" "$results/profile_corun.json" ;;
    baselines) hv replay --simulate --profile "$results/profile_corun.json" --policy all --trace conv --window 600s \
                 --tpot-ms $tpot_ms --out "$results/baselines" ;;
    finetune_off) hv bench serve --model-path "$model" --num-requests 32 --max-new-tokens 128 --rounds 3 \
                    --log-dir "$work/bench" | tee "$results/finetune_off.txt" ;;
    report) write_report ;;
  esac
}

write_report() {
  mkdir -p "$results"
  {
    echo "# harvest GPU results, $(date -u +%Y-%m-%d)"
    echo
    echo "| | |"; echo "| --- | --- |"
    echo "| device | $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1) |"
    echo "| driver | $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1) |"
    echo "| commit | ${HARVEST_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)} |"
    echo "| torch | $($python -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null) |"
    echo "| model | random Llama-3-8B shape, bf16 (harvest model make; bytes per decode step as the real model) |"
    echo
    echo "Stages done: $(ls "$work/stages" | sed 's/.done$//' | tr '\n' ' ')"
    echo
    for f in "$results"/*/results.json; do [ -f "$f" ] && echo "- $(dirname "${f#$results/}"): results.json"; done
  } >"$results/README.md"
  echo "wrote $results/README.md"
}

check_inputs() {  # prints MISSING lines; returns the count
  local missing=0
  if [ ! -f "$work/stages/install.done" ]; then
    if [ -f "$bundle/manifest.json" ] && [ -f "$bundle/install_bundle.py" ]; then
      local n_parts n_found=0 part
      n_parts=$($python -c "import json,sys; print(len(json.load(open(sys.argv[1]))['parts']))" "$bundle/manifest.json")
      for part in $($python -c "import json,sys; print(' '.join(p['name'] for p in json.load(open(sys.argv[1]))['parts']))" "$bundle/manifest.json"); do
        for d in "$bundle" $(printf '%s\n' "${parts_from[@]}" | grep -v -- --parts-from); do
          [ -f "$d/$part" ] && { n_found=$((n_found + 1)); break; }
        done
      done
      echo "bundle: $bundle, $n_found of $n_parts parts present"
      [ "$n_found" = "$n_parts" ] || { echo "MISSING: bundle parts ($n_found of $n_parts; add --parts-from DIR)"; missing=$((missing + 1)); }
    else
      echo "MISSING: bundle ($bundle/manifest.json and install_bundle.py)"; missing=$((missing + 1))
    fi
  fi
  if ! $harvest --help >/dev/null 2>&1; then
    echo "not yet runnable: $harvest (the install stage provides it); its subcommands are not checked"
    return $missing
  fi
  local sub
  for sub in doctor model profile replay bench serve; do
    if $harvest $sub --help >/dev/null 2>&1; then echo "command: harvest $sub ok"
    else echo "MISSING: harvest $sub"; missing=$((missing + 1)); fi
  done
  local flag profile_help
  profile_help=$($harvest profile --help 2>/dev/null)
  for flag in $(declare -f run_stage | grep -o 'hv profile.*' | grep -o -- '--[a-z-]*' | sort -u); do
    if grep -qE -- "(^|[[:space:],])$flag([[:space:],=]|$)" <<<"$profile_help"; then echo "command: harvest profile $flag ok"
    else echo "MISSING: harvest profile $flag (a profile stage passes it)"; missing=$((missing + 1)); fi
  done
  command -v nvidia-smi >/dev/null || echo "note: no nvidia-smi here (the stages need a GPU)"
  return $missing
}

if [ $dry_run = 1 ]; then
  echo "stages (results: $results, work: $work):"
  for entry in "${STAGES[@]}"; do
    read -r name secs desc <<<"$entry"
    state=pending; [ -f "$work/stages/$name.done" ] && state=done
    printf '  %-16s %-7s ~%4ss  %s\n' "$name" "$state" "$secs" "$desc"
  done
  check_inputs; missing=$?
  echo "inputs: $missing missing"
  exit $((missing > 0))
fi

started=$(date +%s)
for entry in "${STAGES[@]}"; do
  read -r name secs desc <<<"$entry"
  [ -n "$only" ] && [ "$name" != "$only" ] && continue
  [ -f "$work/stages/$name.done" ] && continue
  left=$((budget_s - ($(date +%s) - started)))
  if [ "$secs" -gt "$left" ]; then
    echo "stopping before $name (~${secs}s, ${left}s left of --budget-s); run again to resume"; exit 0
  fi
  echo "== stage $name: $desc"
  t0=$(date +%s)
  if timeout 570 bash -c "set -o pipefail; $(declare -f hv serve_and_replay run_stage write_report); $(declare -p model job results work site bundle parts_from python harvest tpot_ms); run_stage $name"; then
    echo "$(( $(date +%s) - t0 ))" >"$work/stages/$name.done"
    echo "== stage $name done in $(( $(date +%s) - t0 )) s"
  else
    echo "== stage $name failed; fix and run again (done stages are kept)" >&2; exit 1
  fi
done
[ -n "$only" ] || echo "all stages done: $results"
