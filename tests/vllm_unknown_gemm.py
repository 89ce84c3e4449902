"""(Run by tests/cost/test_layers.py, in its own process: vLLM's distributed state is set up
here.) vLLM's own ``ReplicatedLinear`` whose linear method dispatches to a GEMM kernel
fxflops has no formula for, as vLLM dispatches per machine (``quant_method.apply``),
compiled with ``backend="fxflops"`` at two sizes; the report is written to argv[1] and the
Prometheus samples printed as JSON."""

from __future__ import annotations

import json
import sys

import torch


def main(out: str) -> None:
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.model_executor.layers.linear import ReplicatedLinear, UnquantizedLinearMethod

    import fxflops
    from fxflops.integrations.vllm.layers import note_model
    from fxflops.outputs import prometheus as metrics

    lib = torch.library.Library("fxflops_test", "DEF")
    lib.define("vendor_gemm(Tensor(a!) out, Tensor x, Tensor w) -> ()")

    def vendor_gemm(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
        out.copy_(x @ w.t())

    lib.impl("vendor_gemm", vendor_gemm, "CPU")
    torch.library.register_fake("fxflops_test::vendor_gemm", lambda out, x, w: None)

    class VendorMethod(UnquantizedLinearMethod):
        def apply(self, layer, x, bias=None):  # a kernel picked for this machine
            y = torch.empty(*x.shape[:-1], layer.weight.shape[0], dtype=x.dtype)
            torch.ops.fxflops_test.vendor_gemm(y, x, layer.weight)
            return y

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = ReplicatedLinear(32, 64, bias=False, params_dtype=torch.float32,
                                       prefix="up", return_bias=False)
            self.up.quant_method = VendorMethod()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.up(x))

    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{out}.store")
        initialize_model_parallel(1, 1)
        model = Block()

    torch.nn.init.normal_(model.up.weight)
    note_model(model)  # what vLLM's compile wrapper does for the model it compiles
    compiled = torch.compile(model, backend="fxflops")
    with torch.no_grad():
        for m in (5, 9, 9):
            x = torch.randn(m, 32)
            torch._dynamo.mark_dynamic(x, 0)  # one graph for any number of tokens
            assert torch.equal(compiled(x), torch.relu(x @ model.up.weight.t()))
    print(json.dumps([s._asdict() for s in metrics.samples(fxflops.recorder())
                      if "estimated" in s.family]))
    fxflops.recorder().save(out)


if __name__ == "__main__":
    main(sys.argv[1])
