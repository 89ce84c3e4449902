"""vLLM integration pieces that run in this process: plugin switch, mode-3 name, piecewise."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

import fxflops
from tests import procs
from tests.helpers import dynamo_graph

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def test_plugin_does_nothing_unless_asked(monkeypatch):
    monkeypatch.delenv("FXFLOPS", raising=False)
    from vllm.compilation.backends import CompilerManager
    from vllm.v1.worker.gpu import model_runner as v2

    from fxflops.integrations.vllm import plugin

    plugin.register()
    runners = [v2.GPUModelRunner.execute_model]
    try:  # the V1 runner, where this vLLM has it (0.34 removed it)
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        pass
    else:
        runners.append(GPUModelRunner._model_forward)
    assert not any(getattr(m, "_fxflops", False) for m in runners)
    assert not getattr(CompilerManager.compile, "_fxflops", False)
    assert not plugin.enabled()


def test_mode3_backend_name_becomes_instrumented_inductor(monkeypatch):
    monkeypatch.delenv("FXFLOPS", raising=False)
    from vllm.config import CompilationConfig

    from fxflops.integrations.vllm import plugin

    plugin.register()
    cc = CompilationConfig(mode=3, backend="fxflops")
    assert cc.backend == "inductor"
    import os

    assert os.environ["FXFLOPS"] == "1"
    monkeypatch.delenv("FXFLOPS")
    from vllm.compilation.backends import CompilerManager

    assert getattr(CompilerManager.compile, "_fxflops", False)


@pytest.mark.parametrize("how", ["FXFLOPS=1", "mode 0", "mode 1", "mode 2", "mode 3"])
def test_vllm_formulas_are_registered_as_fxflops_switches_on(monkeypatch, how):
    """However fxflops is switched on in a vLLM process (``FXFLOPS=1`` as vLLM loads the
    plugin, or the backend name in a compilation config of any mode), vLLM's op formulas
    are registered first: before the hooks through which vLLM's graphs, compiled or loaded
    from its cache, reach the analysis. Switched off, nothing is registered."""
    from vllm.config import CompilationConfig

    from fxflops.cost.registry import formula_for
    from fxflops.integrations.vllm import hooks, plugin

    order: list[str] = []

    def noted(name: str, fn):
        def call():
            order.append(name)
            return fn()

        return call

    monkeypatch.setattr(plugin, "register_formulas", noted("formulas", plugin.register_formulas))
    for name in ("install_mode2_backend", "install_piecewise_compiler"):
        monkeypatch.setattr(hooks, name, noted(name, getattr(hooks, name)))
    if how == "FXFLOPS=1":
        monkeypatch.setenv("FXFLOPS", "1")
        plugin.register()
    else:
        monkeypatch.delenv("FXFLOPS", raising=False)
        plugin.register()
        assert order == []  # off: nothing registered, nothing installed
        CompilationConfig(mode=int(how.split()[1]), backend="fxflops")
        monkeypatch.delenv("FXFLOPS")  # (switch_on set it for the processes vLLM starts)
    assert order[0] == "formulas", order
    assert {"install_mode2_backend", "install_piecewise_compiler"} <= set(order), order
    assert formula_for("vllm::moe_forward") is not None
    plugin.register_formulas()  # again: a module registers once, no duplicate refused


def _silu_mm(x, w):
    return torch.nn.functional.silu(x @ w) * 2


def test_piecewise_compiler_instruments_compile_and_cache_load(monkeypatch, tmp_path):
    """Drives vLLM's own CompilerManager (mode 3's compiler) with a real Dynamo graph.

    vLLM on CPU runs mode 2, so the piecewise path is exercised here through its real
    compiler interface rather than through the engine.
    """
    monkeypatch.setenv("FXFLOPS", "1")
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path / "out"))
    from vllm.compilation.backends import CompilerManager
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.utils import Range

    from fxflops.integrations.vllm import plugin

    plugin.install()
    w = torch.randn(32, 64)
    x = torch.randn(8, 32)
    torch._dynamo.mark_dynamic(x, 0)
    captured = dynamo_graph(_silu_mm, x, w)
    cc = CompilationConfig(mode=3, backend="inductor")

    from tests.helpers import compiler_manager_kwargs

    def compile_once():
        manager = CompilerManager(cc, **compiler_manager_kwargs())  # 0.33: a required keyword
        manager.initialize_cache(str(tmp_path / "cache"), disable_cache=False, prefix="")
        fn = manager.compile(captured["gm"], captured["ex"], {}, cc, Range(start=1, end=16),
                             graph_index=0, num_graphs=1)
        manager.save_to_file()
        return fn

    with set_current_vllm_config(VllmConfig(compilation_config=cc)):
        for _ in ("compile", "load from the cache"):
            fn = compile_once()
            for b in (3, 5):
                xb = torch.randn(b, 32)
                args = [b if isinstance(e, (int, torch.SymInt)) else
                        (xb if e.shape[0] == 8 else w) for e in captured["ex"]]
                out = fn(*args)
                out = out[0] if isinstance(out, (tuple, list)) else out
                torch.testing.assert_close(out, _silu_mm(xb, w))
    rows = fxflops.recorder().stats()
    names = {r["graph"] for r in rows}
    assert names == {"piece0of1:range[1,16]"}
    graphs = fxflops.recorder().graphs
    assert len(graphs) == 2  # once compiled, once loaded from vLLM's cache
    for g in graphs:
        sizes = {r.size: r for r in g.rows.values()}
        assert set(sizes) == {3, 5}
        assert sizes[5].cost.matmul_flops == 2 * 5 * 32 * 64

    # the same path as every other graph: the process's device and dtype (MFU's peak), and
    # an annotated dump of each piece
    report = fxflops.recorder().to_dict()
    assert report["process"]["device"].startswith("cpu")
    assert report["process"]["dtype"] == "fp32"
    dump = tmp_path / "out" / "graphs" / "piece0of1_range_1_16_.py"
    assert dump.exists() and "# fxflops: graph piece0of1:range[1,16]" in dump.read_text()


class _ChangedCompilerManager:
    """vLLM's CompilerManager.compile as a later vLLM might spell it: arguments renamed,
    one added, one removed."""

    def compile(self, gm, inputs, inductor_config, cfg, sizes, *, index=0, extra=None):
        return ("vllm's own result", gm, inputs, sizes, index, extra)


def test_wrappers_pass_everything_through_when_vllm_changes(fxflops_log):
    from fxflops.integrations.vllm import hooks

    with hooks.patch_method(_ChangedCompilerManager, "compile", "piecewise",
                            lambda original: hooks.passthrough(
                                original, after=hooks._instrument_compiled_piece,
                                what="piecewise graph")):
        out = _ChangedCompilerManager().compile("g", [1], {}, "cfg", "r", index=3, extra=4)
        assert out == ("vllm's own result", "g", [1], "r", 3, 4)  # untouched
        with pytest.raises(TypeError):  # vLLM's own error for a bad call, not ours
            _ChangedCompilerManager().compile("g")
    assert "compile" not in _ChangedCompilerManager.__dict__ or \
        not getattr(_ChangedCompilerManager.compile, "_fxflops", False)
    warnings = [r.getMessage() for r in fxflops_log.records]
    assert len([m for m in warnings if "piecewise graph not instrumented" in m]) == 1


def test_forward_wrapper_survives_a_changed_signature(fxflops_log):
    from fxflops.integrations.vllm import forward

    class Runner:
        def _model_forward(self, tokens, *, new_kwarg=None):  # no input_ids/positions
            return ("forward", tokens, new_kwarg)

    wrapped = forward._timed_forward(Runner._model_forward)
    assert wrapped(Runner(), [1, 2], new_kwarg=5) == ("forward", [1, 2], 5)
    assert fxflops.recorder().forwards == {}


# --- installed, not switched on: vLLM's hash and its workers' environment ----------------

SNAPSHOT = """
import json, os, sys
from vllm.config import CompilationConfig, VllmConfig
import vllm.envs as envs
from vllm.ray.ray_env import get_env_vars_to_copy
from vllm.compilation.caching import aot_compile_hash_factors

def config_key(config):
    # vLLM's compile-cache key of the config: compute_hash() to 0.33; from 0.34 the
    # compile_factors() of the config and each sub-config, which compute_hash became
    if hasattr(config, "compute_hash"):
        return config.compute_hash()
    return repr(config.compile_factors(include_version=True))

def snapshot():
    config = VllmConfig(compilation_config=CompilationConfig(mode=3))
    return {"config": config_key(config), "aot": aot_compile_hash_factors(config),
            "ray": sorted(get_env_vars_to_copy()), "environ": dict(os.environ)}

before = snapshot()
from vllm.plugins import load_general_plugins
load_general_plugins()
import fxflops.integrations.vllm.plugin as plugin
after = snapshot()
print(json.dumps({"before": before, "after": after, "watching": "watch" in plugin._installed,
                  "on": "hooks" in plugin._installed}, default=repr))
"""


def test_installed_but_off_fxflops_leaves_vllms_hash_and_workers_environment():
    """Before and after vLLM loads its plugins (fxflops' among them, not switched on), in
    one process: the same config hash (0.34: the same ``compile_factors()``, which replaced
    ``compute_hash``), the same AOT cache-key factors (vLLM's hashed
    environment among them), the same variables for Ray's workers, the same environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXFLOPS")}
    proc = procs.run([sys.executable, "-c", SNAPSHOT], timeout=300,
                     cwd=Path(__file__).resolve().parents[3], env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["watching"] and not got["on"]  # fxflops' plugin was loaded, and stayed off
    assert got["after"] == got["before"]


# --- the documented command lines (docs/vllm.md), parsed as vLLM's CLI parses them --------

CLI = """
import json, os, sys
# vLLM's CLI imports its engine arguments before it loads the general plugins: imported
# once here, then each command line resolved in a child forked from this process, so that
# each starts as a fresh CLI would, plugins not loaded yet (what costs a CLI process its
# seconds is importing vLLM: paid once)
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser


def resolve(argv):
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # as vLLM's CLI does, before it parses its arguments
    import fxflops.integrations.vllm.plugin as plugin
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        return {"refused": True}
    config = EngineArgs.from_cli_args(args).create_engine_config()
    cc = config.compilation_config
    return {"refused": False, "mode": int(cc.mode), "backend": cc.backend,
            "on": os.environ.get("FXFLOPS") == "1", "hooks": "hooks" in plugin._installed}


children = []
for i, argv in enumerate(json.loads(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        try:
            got = resolve(argv)
        except BaseException as e:
            got = {"error": f"{type(e).__name__}: {e}"}
        os.write(1, (json.dumps([i, got]) + "\\n").encode())  # (one line: one write)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""


def resolve(model: str, clis: list[tuple[str, ...]]) -> list[dict]:
    """What vLLM's CLI makes of ``vllm serve MODEL *cli`` (its engine config), for each
    of ``clis``, each in a process of its own where nothing switched fxflops on before."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXFLOPS")}
    common = ["--model", model, "--load-format", "dummy", "--skip-tokenizer-init",
              "--max-model-len", "512"]
    proc = procs.run([sys.executable, "-c", CLI,
                      json.dumps([[*common, *cli] for cli in clis])], timeout=300,
                     cwd=Path(__file__).resolve().parents[3], env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = dict(json.loads(line) for line in proc.stdout.splitlines()
               if line.startswith("[") and line.endswith("}]"))
    assert sorted(got) == list(range(len(clis))), (proc.stdout[-2000:], proc.stderr[-4000:])
    return [got[i] for i in range(len(clis))]


def test_the_documented_command_lines_switch_fxflops_on():
    """docs/vllm.md's command lines, through vLLM's own argument parser and engine config:
    the backend name switches fxflops on in every mode; in mode 3, and where vLLM picks the
    mode (from -O), it becomes vLLM's Inductor (vLLM's CPU platform turns mode 3 into mode
    2 with Inductor); in mode 2 it stays; -O0 compiles nothing, fxflops on all the same.
    The old spelling (-O as the config, a ``level`` key) is refused by vLLM."""
    import tempfile

    from vllm.platforms import current_platform

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
    import vllm_tiny

    model = vllm_tiny.tiny_llama(os.path.join(tempfile.gettempdir(), "fxflops-tiny-llama"))
    piecewise = 2 if current_platform.is_cpu() else 3  # (vLLM on CPU: mode 2, Inductor)
    cases = {
        ("-cc", '{"mode": 3, "backend": "fxflops"}'): (piecewise, "inductor"),
        ("-cc", '{"backend": "fxflops"}'): (piecewise, "inductor"),
        ("-cc.backend=fxflops",): (piecewise, "inductor"),
        ("-cc", '{"mode": 2, "backend": "fxflops"}'): (2, "fxflops"),
        ("-cc", '{"backend": "fxflops"}', "-O0"): (0, "inductor"),
    }
    off = ("-cc", '{"mode": 3}')
    old = ("-O", "{'level': 3, 'backend': 'fxflops'}")
    clis = [*cases, off, old]
    got = dict(zip(clis, resolve(model, clis)))
    for cli, (mode, backend) in cases.items():
        assert got[cli] == {"refused": False, "mode": mode, "backend": backend, "on": True,
                            "hooks": True}, (cli, got[cli])
    assert got[off] == {
        "refused": False, "mode": piecewise, "backend": "inductor", "on": False, "hooks": False}
    assert got[old]["refused"]
