"""vLLM's GPU package (0.33, its torch 2.14) as a GPU user gets it, on this machine's CPU.

vLLM's compilation and runner code run on CPU tensors behind the tests' CUDA platform
(``tests/cuda_platform_plugin``: vLLM's own CUDA platform, its device queries answered as an
H200's, a stand-in ``libcuda.so.1`` that reports no device): ``VllmConfig`` resolves to mode
3 (piecewise), CUDA graphs ``FULL_AND_PIECEWISE``, the V2 model runner, and with torch >=
2.12 vLLM's AOT compile cache. CI's vLLM 0.33 leg (``scripts/vllm_leg.sh``) runs this module
with that platform on; elsewhere it skips, saying why.

What runs here: a tiny ``@support_torch_compile`` decoder compiled by vLLM's real mode 3
(``tests/vllm_launch.py``, CUDA graphs off), launched in processes of their own that share
``VLLM_CACHE_ROOT``: cold, then warm from vLLM's AOT artifact, with and without fxflops.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from fxflops.report.files import load_reports
from tests import procs
from tests.helpers import vllm_cache_root

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[3]
PLATFORM_VARIABLE = "TEST_VLLM_CUDA_PLATFORM"


def _on_the_test_platform() -> bool:
    if os.environ.get(PLATFORM_VARIABLE) != "1":
        return False
    from vllm.platforms import current_platform

    return type(current_platform).__name__ == "TestCudaPlatform"


if not _on_the_test_platform():
    pytest.skip(f"needs vLLM's GPU package behind the tests' CUDA platform ({PLATFORM_VARIABLE}"
                "=1, tests/cuda_platform_plugin on PYTHONPATH: scripts/vllm_leg.sh)",
                allow_module_level=True)


def test_vllm_resolves_a_gpu_users_configuration():
    from vllm.config import CompilationMode, CUDAGraphMode, VllmConfig
    from vllm.platforms import current_platform

    config = VllmConfig()
    assert current_platform.is_cuda() and current_platform.get_device_capability() == (9, 0)
    assert config.compilation_config.mode == CompilationMode.VLLM_COMPILE
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
    # the V2 runner: vLLM's GPU default in 0.33 (``use_v2_model_runner``), the only one
    # from 0.34 (the V1 runner's module is gone)
    if hasattr(config, "use_v2_model_runner"):
        assert config.use_v2_model_runner
    else:
        import importlib.util

        assert importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None
    import vllm.envs as envs

    assert envs.VLLM_USE_AOT_COMPILE and envs.VLLM_USE_MEGA_AOT_ARTIFACT


# --- launches: cold and warm, through vLLM's AOT artifact ----------------------------------


def launch(tmp: Path, name: str, how: str, cache: Path) -> tuple[dict, dict | None]:
    """One process compiling (or loading) and running the tiny decoder: its result
    (tests/vllm_launch.py) and fxflops' report (None where fxflops was off)."""
    out = tmp / name
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXFLOPS")}
    env.update(VLLM_CACHE_ROOT=vllm_cache_root(cache), FXFLOPS_OUT=str(out / "fxflops"))
    proc = procs.run([sys.executable, str(ROOT / "tests" / "vllm_launch.py"),
                      str(tmp / f"{name}.json"), how], timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"{name}: {proc.stdout[-2000:]}{proc.stderr[-6000:]}"
    result = json.loads((tmp / f"{name}.json").read_text())
    assert all(o["equal"] for o in result["outputs"].values()), (name, result["outputs"])
    reports = load_reports([out / "fxflops"]) if (out / "fxflops").exists() else []
    return result, (reports[0] if reports else None)


def counters(result: dict) -> dict:
    return {k: v for k, v in result["counters"].items() if v}


def rows(report: dict) -> dict:
    """{(graph, size): (calls, matmul FLOPs per call, FLOPs per call, bytes per call)}."""
    return {(g["name"], r["size"]): (r["calls"], r["matmul_flops"], r["flops"], r["bytes_io"])
            for g in report["graphs"] for r in g["rows"]}


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> dict:
    """Seven launches, one after another:

    - ``bare``: fxflops not loaded at all (as if not installed), cold: writes cache A;
    - ``off``: fxflops installed, not switched on: warm from cache A;
    - ``env_warm``: ``FXFLOPS=1``, warm from cache A (written without fxflops);
    - ``name_cold``: the backend name alone, cold: writes cache B;
    - ``env_warm_b``: ``FXFLOPS=1``, warm from cache B (written with fxflops);
    - ``env_cold``: ``FXFLOPS=1``, cold: writes cache C;
    - ``name_warm_c``: the backend name alone, warm from cache C.
    Each switch is thus seen cold and warm, each pair sharing one ``VLLM_CACHE_ROOT``."""
    tmp = tmp_path_factory.mktemp("launches")
    a, b, c = tmp / "cache-a", tmp / "cache-b", tmp / "cache-c"
    plan = [("bare", "bare", a), ("off", "off", a), ("env_warm", "env", a),
            ("name_cold", "name", b), ("env_warm_b", "env", b),
            ("env_cold", "env", c), ("name_warm_c", "name", c)]
    return {name: launch(tmp, name, how, cache) for name, how, cache in plan}


def test_installed_but_off_fxflops_changes_nothing_vllm_compiles(launches):
    """With fxflops installed and off, vLLM finds the artifact a launch without fxflops
    wrote (same compile-cache key: same config hash, same hashed environment) and runs it:
    nothing compiled, the same outputs; and fxflops writes nothing."""
    bare, bare_report = launches["bare"]
    off, off_report = launches["off"]
    assert counters(bare)["num_inductor_compiles"] > 0
    assert counters(off) == {"num_models_seen": 1, "num_aot_artifacts_loaded": 1,
                             "num_compiled_artifacts_loaded":
                                 counters(bare)["num_compiled_artifacts_saved"]}
    assert off["outputs"] == bare["outputs"]
    assert off["fxflops_loaded"] and not bare["fxflops_loaded"]
    assert bare_report is None and off_report is None


def test_a_cold_launch_by_name_is_instrumented_and_exact(launches):
    """Mode 3 with ``backend="fxflops"``: vLLM's Inductor compiles each piece (the name
    became ``inductor``, as vLLM accepts in mode 3), instrumented: one row per piece and
    size, the matmul FLOPs of the pieces at a size summing to FlopCounterMode's count of
    the uncompiled model; and vLLM's artifact keeps as many pieces as without fxflops."""
    cold, report = launches["name_cold"]
    bare, _ = launches["bare"]
    assert cold["mode"] == 3 and cold["backend"] == "inductor"
    assert counters(cold)["num_compiled_artifacts_saved"] == \
        counters(bare)["num_compiled_artifacts_saved"] > 0
    assert report is not None
    pieces = {g["name"] for g in report["graphs"]}
    assert pieces and all(name.startswith("piece") for name in pieces)
    for size, output in cold["outputs"].items():
        at_size = [r for (_, s), r in rows(report).items() if s == int(size)]
        assert len(at_size) == len(pieces)
        assert sum(r[1] for r in at_size) == output["flops"] > 0, size


def test_warm_launches_are_instrumented_as_the_cold_one(launches):
    """A warm start loads every piece from vLLM's AOT artifact and compiles nothing; its
    pieces are instrumented as the cold launch's were: the same graphs, sizes, calls and
    FLOPs and bytes per call, from an artifact written with fxflops (cache B) or without
    (cache A)."""
    _, cold_report = launches["name_cold"]
    for name in ("env_warm", "env_warm_b", "name_warm_c"):
        warm, report = launches[name]
        assert "num_inductor_compiles" not in counters(warm)
        assert counters(warm)["num_aot_artifacts_loaded"] == 1
        assert report is not None, name
        assert rows(report) == rows(cold_report), name


def test_either_switch_cold_or_warm_records_the_same_exact_rows(launches):
    """``FXFLOPS=1`` cold and the backend name warm from its cache, as the backend name
    cold and ``FXFLOPS=1`` warm from its: every launch writes a report with the same graphs,
    sizes, calls and FLOPs per call, the pieces' matmul FLOPs at each size summing to the
    uncompiled model's (FlopCounterMode's, by the launch script)."""
    _, reference = launches["name_cold"]
    cold, report = launches["env_cold"]
    assert cold["mode"] == 3 and "num_inductor_compiles" in counters(cold)
    assert report is not None and rows(report) == rows(reference)
    for size, output in cold["outputs"].items():
        assert sum(r[1] for (_, s), r in rows(report).items() if s == int(size)) == \
            output["flops"] > 0, size


def test_features_a_release_lacks_are_named_in_its_reports(launches):
    """Each launch's report lists the features this vLLM lacks (its runner hooks that do
    not resolve here: 0.34's V1 runner among them), each with the version, and no other."""
    from fxflops.integrations.vllm.symbols import FEATURES, missing

    expected = {f for f in FEATURES if missing(f)}
    for name in ("env_warm", "name_cold", "env_cold", "name_warm_c"):
        _, report = launches[name]
        off = report["process"].get("features_off") or {}
        assert set(off) == expected, (name, off)
        assert all(why.startswith(f"vllm {vllm.__version__}: ") for why in off.values())
