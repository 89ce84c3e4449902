import logging

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test starts with no compiled graphs and an empty recorder."""
    import fxflops.analysis
    import fxflops.recording

    torch._dynamo.reset()
    fxflops.recording._RECORDER = None
    fxflops.analysis._warned.clear()
    yield
    torch._dynamo.reset()
    if fxflops.recording._RECORDER is not None:
        fxflops.recording._RECORDER.stop()
    fxflops.recording._RECORDER = None


@pytest.fixture
def fxflops_log(caplog):
    caplog.set_level(logging.WARNING, logger="fxflops")
    return caplog
