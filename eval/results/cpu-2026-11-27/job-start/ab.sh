# old = a worktree at 4742717 (before the request wait), new = f2e7ee1; both with /work/main/.venv
here=$(cd "$(dirname "$0")" && pwd)
set -e
for round in 1 2; do
  for side in old new; do
    repo=$([ $side = old ] && echo /tmp/wt-old || echo /work/main)
    (cd $repo && PYTHONPATH=$repo /work/main/.venv/bin/python $here/job_start.py /tmp/job-start-$side $side-$round)
  done
done
