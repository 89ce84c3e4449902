"""One launch of a tiny model through vLLM's own compilation, as a server's worker compiles
its model: a ``@support_torch_compile`` module built under a ``VllmConfig``, run in mode 3
(piecewise: split at an attention-like op, each piece compiled by vLLM's Inductor backend
per compile range), CUDA graphs off, on CPU tensors.

On vLLM's GPU package (0.33) this runs behind the tests' CUDA platform
(``tests/cuda_platform_plugin``, ``TEST_VLLM_CUDA_PLATFORM=1``), with the defaults a GPU
user gets: mode 3, and with torch >= 2.12 vLLM's AOT compile cache (``VLLM_USE_AOT_COMPILE``,
``VLLM_USE_MEGA_AOT_ARTIFACT``) under ``VLLM_CACHE_ROOT``: a second launch with the same
cache folder loads what the first saved, and compiles nothing.

    python tests/vllm_launch.py OUT.json [off|env|name] [mode]

vLLM's general plugins are loaded first, as vLLM's engine and workers load them, except in
``bare`` (as if fxflops were not installed). ``off``: installed, not switched on;
``env``: ``FXFLOPS=1``; ``name``: the backend name in the compilation config
(``backend="fxflops"``, the config made as ``-cc`` is, once the plugins are loaded).
``mode``: vLLM's compilation mode (3 by default). Writes ``OUT.json``: per
size, the output's checksum, whether it equals the uncompiled model's, and
``FlopCounterMode``'s matmul FLOPs of the uncompiled model; vLLM's compile counters; the
compilation config as vLLM resolved it. fxflops writes its report where ``FXFLOPS_OUT``
says.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn

HIDDEN, LAYERS = 32, 2
SIZES = (3, 5, 8)  # tokens per forward
MAX_TOKENS = 16  # max_num_batched_tokens: the compile range is [1, 16]


@torch.library.custom_op("fxflops_test::attention", mutates_args=["out"])
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """Stands in for vLLM's attention op: where vLLM splits the graph into pieces."""
    out.copy_(q + k * v)


@attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    return None


def model_class() -> type[nn.Module]:
    from vllm.compilation.decorators import support_torch_compile

    @support_torch_compile(dynamic_arg_dims={"x": 0})
    class TinyDecoder(nn.Module):
        def __init__(self, *, vllm_config, prefix: str = "", **kwargs) -> None:
            super().__init__()
            self.up = nn.ModuleList(nn.Linear(HIDDEN, 3 * HIDDEN) for _ in range(LAYERS))
            self.down = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for up, down in zip(self.up, self.down):
                q, k, v = up(x).chunk(3, dim=-1)
                out = torch.empty_like(q)
                torch.ops.fxflops_test.attention(q, k, v, out)
                x = x + down(torch.nn.functional.silu(out))
            return x

    return TinyDecoder


def launch(how: str = "off", mode: int = 3) -> dict:
    from vllm.config import (
        CompilationConfig,
        CUDAGraphMode,
        SchedulerConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.forward_context import set_forward_context

    if how == "env":
        os.environ["FXFLOPS"] = "1"
    if how != "bare":
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # as vLLM's engine and workers do, before the config is made
    # (made once the plugins are loaded, as ``-cc`` is parsed: mode 3 takes the name)
    compilation = CompilationConfig(mode=mode,
                                    backend="fxflops" if how == "name" else "inductor",
                                    splitting_ops=["fxflops_test::attention"],
                                    cudagraph_mode=CUDAGraphMode.NONE)
    vllm_config = VllmConfig(compilation_config=compilation,
                             scheduler_config=SchedulerConfig(
                                 max_num_batched_tokens=MAX_TOKENS, max_num_seqs=MAX_TOKENS,
                                 max_model_len=MAX_TOKENS, is_encoder_decoder=False))
    torch.manual_seed(0)
    with set_current_vllm_config(vllm_config):
        model = model_class()(vllm_config=vllm_config, prefix="")
    from torch.utils.flop_counter import FlopCounterMode

    outputs = {}
    with torch.no_grad(), set_forward_context({}, vllm_config=vllm_config):
        for size in SIZES:
            x = torch.linspace(-1, 1, size * HIDDEN).reshape(size, HIDDEN)
            got = model(x)
            with FlopCounterMode(display=False) as counter:
                expected = eager(model, x)
            outputs[size] = {"sum": float(got.sum()), "equal": bool(torch.allclose(
                got, expected, rtol=1e-5, atol=1e-6)), "flops": counter.get_total_flops()}
    from vllm.compilation.counter import compilation_counter

    return {"outputs": outputs, "mode": int(vllm_config.compilation_config.mode),
            "fxflops_loaded": "fxflops.integrations.vllm.plugin" in sys.modules,
            "counters": {k: v for k, v in vars(compilation_counter).items()
                         if isinstance(v, int)},
            "backend": vllm_config.compilation_config.backend}


def eager(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's forward without any compilation (the reference)."""
    for up, down in zip(model.up, model.down):
        q, k, v = up(x).chunk(3, dim=-1)
        x = x + down(torch.nn.functional.silu(q + k * v))
    return x


if __name__ == "__main__":
    out_path = sys.argv[1]
    result = launch(sys.argv[2] if len(sys.argv) > 2 else "off",
                    int(sys.argv[3]) if len(sys.argv) > 3 else 3)
    if "fxflops" in sys.modules:
        import fxflops

        fxflops.recorder().flush()
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
