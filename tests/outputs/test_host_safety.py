"""fxflops never changes or breaks the program it measures: threads, signals, forks,
compile options, graphs it cannot instrument, artifacts it cannot use.

The processes that get signals or fork are real subprocesses (``tests/procs.py``: a
timeout each, default signal handlers), each a small host program written out here.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import fxflops
from fxflops import torch_compat
from fxflops.report.files import load_reports
from tests import procs

ROOT = Path(__file__).resolve().parents[2]


def host(tmp_path: Path, code: str, *args: str, env: dict | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(code))
    return procs.run([sys.executable, str(script), *args], timeout=timeout, cwd=ROOT,
                     env={**os.environ, **(env or {})})


# --- threads --------------------------------------------------------------------------


def test_threads_at_new_sizes_while_reports_and_scrapes_run(tmp_path, monkeypatch):
    """10 s: 4 threads calling at ever new sizes, while another flushes the report and
    scrapes Prometheus and reads the rows in a loop. No exception anywhere; the report's
    calls are the calls made."""
    prometheus_client = pytest.importorskip("prometheus_client")
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    compiled = torch.compile(lambda x: x * 2 + 1, backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    compiled(torch.randn(1))  # compiled once, on this thread
    registry = prometheus_client.CollectorRegistry()
    fxflops.recorder().register_prometheus(registry)
    stop = time.monotonic() + 10
    made = [0] * 4
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        try:
            n = 0
            while time.monotonic() < stop:
                compiled(torch.randn(2 + (4 * n + i) % 5000))  # a new size most calls
                n += 1
            made[i] = n
        except BaseException as e:  # noqa: BLE001 (any exception fails the test)
            errors.append(e)

    def reader() -> None:
        try:
            while time.monotonic() < stop:
                fxflops.recorder().flush()
                list(registry.collect())
                fxflops.recorder().stats()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    fxflops.recorder().flush()
    (report,) = load_reports([tmp_path])
    calls = sum(r["calls"] for g in report["graphs"] for r in g["rows"])
    assert calls == 1 + sum(made) and sum(made) > 1000


# --- signals ----------------------------------------------------------------------------

_SIGNAL_IN_FLUSH = """
import os, signal, sys, torch, fxflops

class HostStop(Exception):
    pass

def host_handler(sig, frame):
    raise HostStop("the host's own")

signal.signal(signal.SIGTERM, host_handler)
f = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"), dynamic=True)
for n in range(2, 400):  # many sizes: a flush takes a while
    f(torch.randn(n))
rec = fxflops.recorder()
original = rec.files.write_report

def write_then_be_signalled(snapshot, path):
    os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the flush
    original(snapshot, path)

rec.files.write_report = write_then_be_signalled
try:
    rec.flush()
except HostStop as e:
    print("host caught:", e, flush=True)
    sys.exit(0)
print("the host never saw its exception", flush=True)
sys.exit(1)
"""


def test_host_handler_raising_inside_a_flush_reaches_the_host(tmp_path):
    out = tmp_path / "out"
    proc = host(tmp_path, _SIGNAL_IN_FLUSH, env={"FXFLOPS_OUT": str(out)})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "host caught: the host's own" in proc.stdout
    (report,) = load_reports([out])  # valid, whole
    assert sum(r["calls"] for r in report["graphs"][0]["rows"]) == 398


_SIGNAL_IMPORTS = """
import os, signal, sys, torch, fxflops

f = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"), dynamic=True)
for n in range(2, 6):
    f(torch.randn(n))

class Watch:
    # every import asked for from here on: the signal path must ask for none (a module
    # half-imported when a signal lands would raise ImportError into the host)
    def find_spec(self, name, path=None, target=None):
        print("imported on the signal path:", name, file=sys.stderr, flush=True)
        return None

sys.meta_path.insert(0, Watch())
os.kill(os.getpid(), signal.SIGTERM)
print("not reached", flush=True)
"""


def test_the_signal_path_imports_nothing(tmp_path):
    out = tmp_path / "out"
    proc = host(tmp_path, _SIGNAL_IMPORTS, env={"FXFLOPS_OUT": str(out)})
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-3000:]  # ended as it would have
    assert "imported on the signal path" not in proc.stderr, proc.stderr[-3000:]
    assert "not reached" not in proc.stdout
    (report,) = load_reports([out])
    assert sum(r["calls"] for r in report["graphs"][0]["rows"]) == 4


_SIGTERM_NOT_ACTED_ON = """
import os, signal, sys, threading, time, torch, fxflops
from fxflops.outputs import signals

f = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"))
f(torch.randn(3))
assert signals._WAKEUP, "fxflops watches the SIGTERM it made a Python handler"
# a SIGTERM whose arrival the watcher sees (its byte on the wakeup pipe) but whose handler
# never ran: what a main thread woken in C under load can do
read_fd, write_fd = os.pipe()
threading.Thread(target=signals._sigterm_watcher, args=(read_fd,), daemon=True).start()
started = time.monotonic()
os.write(write_fd, bytes([signal.SIGTERM]))
time.sleep(30)
print("never acted on", flush=True)
"""


def test_a_sigterm_python_did_not_act_on_is_sent_again(tmp_path):
    out = tmp_path / "out"
    started = time.monotonic()
    proc = host(tmp_path, _SIGTERM_NOT_ACTED_ON, env={"FXFLOPS_OUT": str(out)})
    assert proc.returncode == -signal.SIGTERM, proc.stdout + proc.stderr[-3000:]
    assert "never acted on" not in proc.stdout
    assert time.monotonic() - started < 25  # sent again after a second, not at the end
    (report,) = load_reports([out])  # the handler ran: the report is there
    assert sum(r["calls"] for r in report["graphs"][0]["rows"]) == 1


_SIGNALS_DURING_CALLS = """
import os, signal, sys, time, torch, fxflops

class HostStop(Exception):
    pass

def host_handler(sig, frame):
    # raised where it lands in fxflops' own code (the call's bookkeeping, around the
    # inner callable; with an eager inner, in the copy of the graph's forward that holds
    # it), which must let it through and stay instrumented
    name = frame.f_code.co_filename
    if os.sep + "fxflops" + os.sep in name or name.startswith("<fxflops "):
        raise HostStop()

f = torch.compile(lambda x: x * 2 + 1, backend=fxflops.backend(inner="eager"), dynamic=True)
x = torch.randn(8)
f(x)
signal.signal(signal.SIGALRM, host_handler)
signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)  # lands anywhere, fxflops' code too
made = interrupted = 0
end = time.monotonic() + 3
while time.monotonic() < end:
    try:
        f(x)
        made += 1
    except HostStop:
        interrupted += 1
signal.setitimer(signal.ITIMER_REAL, 0)
rec = fxflops.recorder()
before = sum(r["calls"] for r in rec.stats())
for _ in range(1000):  # still instrumented: every call counted
    f(x)
after = sum(r["calls"] for r in rec.stats())
print("made", made, "interrupted", interrupted, "before", before, "after", after,
      "uninstrumented", len(rec.to_dict()["uninstrumented"]), flush=True)
"""


def test_host_exceptions_from_signals_during_calls_leave_the_graph_instrumented(tmp_path):
    proc = host(tmp_path, _SIGNALS_DURING_CALLS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    figures = {k: int(v) for k, v in zip(words[::2], words[1::2])}
    assert figures["interrupted"] >= 10, figures  # the host's exceptions did land
    # every call that returned was counted (one interrupted inside may have been too)
    assert figures["made"] + 1 <= figures["before"] <= figures["made"] + 1 + \
        figures["interrupted"], figures
    assert figures["after"] - figures["before"] == 1000 and figures["uninstrumented"] == 0


_OFF_MAIN_THREAD = """
import signal, sys, threading, time, torch, fxflops

def compile_and_run():
    f = torch.compile(lambda x: x * 3, backend=fxflops.backend(inner="eager"), dynamic=True)
    for n in (2, 3, 2):
        f(torch.randn(n))

t = threading.Thread(target=compile_and_run)
t.start()
t.join()
print("ready", flush=True)
for _ in range(600):  # the main thread runs Python: the signal hooks are set here
    time.sleep(0.05)
"""


def test_first_graph_off_the_main_thread_still_writes_at_sigterm(tmp_path):
    out = tmp_path / "out"
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(_OFF_MAIN_THREAD))
    proc = procs.popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                       env={**os.environ, "FXFLOPS_OUT": str(out)})
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        while proc.stdout.readline().strip() != "ready":
            assert proc.poll() is None
        time.sleep(0.5)  # the main thread runs the pending call between two sleeps
        proc.send_signal(signal.SIGTERM)
        procs.finish(proc, timeout=60)
    finally:
        watchdog.cancel()
    assert proc.returncode == -signal.SIGTERM  # ended by the signal, as without fxflops
    (report,) = load_reports([out])
    assert {r["size"]: r["calls"] for r in report["graphs"][0]["rows"]} == {2: 2, 3: 1}


# --- fork and spawn -----------------------------------------------------------------------

_FORK = """
import multiprocessing as mp, os, sys, torch, fxflops

f = torch.compile(lambda x: x - 1, backend=fxflops.backend(inner="eager"), dynamic=True)
for n in (2, 3, 4):
    f(torch.randn(n))  # 3 calls before the forks: the parent's

pid = os.fork()
if pid == 0:  # a bare fork, ending normally: 4 calls of its own
    for n in (2, 2, 5, 6):
        f(torch.randn(n))
    sys.exit(0)
os.waitpid(pid, 0)

def work():  # a multiprocessing fork child: it ends with os._exit
    for n in (7, 7):
        f(torch.randn(n))

p = mp.get_context("fork").Process(target=work)
p.start()
p.join()
f(torch.randn(2))  # 1 more in the parent
print("pids", os.getpid(), pid, p.pid, flush=True)
"""


def test_fork_children_report_their_own_calls(tmp_path):
    out = tmp_path / "out"
    proc = host(tmp_path, _FORK, env={"FXFLOPS_OUT": str(out)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent, child, mp_child = (int(x) for x in proc.stdout.split("pids")[1].split())
    reports = {r["process"]["pid"]: r for r in load_reports([out])}
    calls = {pid: sum(r["calls"] for g in rep["graphs"] for r in g["rows"])
             for pid, rep in reports.items()}
    # each process its own calls: 3 + 1, 4, 2; together the 10 made
    assert calls == {parent: 4, child: 4, mp_child: 2}
    assert len({rep["run"]["id"] for rep in reports.values()}) == 1  # one run


_FORK_MID_FLUSH = """
import os, sys, threading, time, torch, fxflops

f = torch.compile(lambda x: x + 2, backend=fxflops.backend(inner="eager"), dynamic=True)
f(torch.randn(2))
rec = fxflops.recorder()
write, entered = rec.files.write_report, threading.Event()

def slow_write(snapshot, path):
    entered.set()
    time.sleep(1.0)
    write(snapshot, path)

rec.files.write_report = slow_write
flusher = threading.Thread(target=rec.flush)
flusher.start()
entered.wait(60)  # that thread holds the flush lock now
pid = os.fork()
if pid == 0:
    f(torch.randn(3))
    sys.exit(0)  # the child's exit flush: it must not wait for the parent's thread
_, status = os.waitpid(pid, 0)
flusher.join()
print("child", pid, os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_fork_while_another_thread_flushes_leaves_a_working_child(tmp_path):
    out = tmp_path / "out"
    proc = host(tmp_path, _FORK_MID_FLUSH, env={"FXFLOPS_OUT": str(out)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, pid, code = proc.stdout.split()
    assert code == "0"
    reports = {r["process"]["pid"]: r for r in load_reports([out])}
    assert {r["size"]: r["calls"] for r in reports[int(pid)]["graphs"][0]["rows"]} == {3: 1}


_POOL = """
import multiprocessing as mp, os, sys, time, torch, fxflops

def work(i):
    f = torch.compile(lambda x: x * 2, backend=fxflops.backend(inner="eager"), dynamic=True)
    for n in range(2, 40):
        f(torch.randn(n))
    rec = fxflops.recorder()
    if not hasattr(rec, "slow"):  # each flush now takes 0.4 s: terminate lands in one
        write, rec.slow = rec.files.write_report, True
        rec.files.write_report = lambda snapshot, path: (time.sleep(0.4), write(snapshot, path))
    return os.getpid()

if __name__ == "__main__":
    pool = mp.get_context("spawn").Pool(4)
    pids = set(pool.map(work, range(8)))
    # the workers flush every 0.1 s, each for 0.4 s: all are writing now (and their main
    # threads wait on the task queue's lock, which terminate holds: the SIGTERM they miss
    # there is sent again by fxflops)
    time.sleep(0.3)
    pool.terminate()
    pool.join()
    print("workers", *sorted(pids), flush=True)
"""


def test_a_terminated_spawn_pool_leaves_every_report_or_names_it(tmp_path, capsys):
    from fxflops.cli.main import main

    out = tmp_path / "out"
    proc = host(tmp_path, _POOL, env={"FXFLOPS_OUT": str(out), "FXFLOPS_FLUSH_S": "0.1"},
                timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    workers = {int(x) for x in proc.stdout.split("workers")[1].split()}
    skipped: list[str] = []
    reports = load_reports([out], skipped)
    reported = {r["process"]["pid"] for r in reports}
    named_missing = {pid for pid in workers for line in skipped if f"process {pid} " in line}
    assert reported | named_missing == workers and not (reported & named_missing)
    code = main(["report", str(out)])
    err = capsys.readouterr().err
    assert code == (3 if named_missing else 0)
    assert all(f"process {pid} " in err for pid in named_missing)


# --- what torch.compile is given ----------------------------------------------------------


@pytest.mark.parametrize("kwargs,config", [
    ({"mode": "max-autotune-no-cudagraphs"}, {"max_autotune": True, "coordinate_descent_tuning": True}),
    ({"options": {"epilogue_fusion": False}}, {"epilogue_fusion": False})])
def test_mode_and_options_reach_inductor(kwargs, config, monkeypatch):
    from torch._inductor import compile_fx as compile_fx_module

    def f(x):
        return torch.relu(x) * 2 + 1

    given: list[dict] = []
    original = compile_fx_module.compile_fx

    def compile_fx(gm, example_inputs, config_patches=None, **rest):
        given.append(dict(config_patches or {}))
        return original(gm, example_inputs, config_patches=config_patches, **rest)

    monkeypatch.setattr(compile_fx_module, "compile_fx", compile_fx)
    x = torch.randn(16)
    ours = torch.compile(f, backend="fxflops", **kwargs)(x)
    # Inductor got the config torch.compile's mode/options stand for (written by hand;
    # compile_fx applies its patches and calls itself again: the first call is ours)
    patches = given[0]
    assert {k: patches.get(k) for k in config} == config, patches
    monkeypatch.setattr(compile_fx_module, "compile_fx", original)
    torch._dynamo.reset()
    theirs = torch.compile(f, backend="inductor", **kwargs)(x)
    assert torch.equal(ours, theirs)
    (graph,) = fxflops.recorder().graphs
    assert graph.rows  # instrumented, not refused


def test_double_backward_through_the_eager_inner_works_as_eager():
    def f(x):
        return (x ** 3).sum()

    x = torch.randn(5, requires_grad=True)
    y = torch.compile(f, backend=fxflops.backend(inner="eager"))(x)
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    g.sum().backward()
    assert torch.allclose(x.grad, 6 * x.detach())  # d/dx of 3x², by hand


def test_a_graph_it_cannot_instrument_is_in_the_report_with_its_calls(tmp_path, fxflops_log):
    """A size read from tensor data (``.item()``: an unbacked symbol) that is in no input's
    shape and no output's (a graph that returns such a tensor is bound from its outputs:
    tests/instrument/test_eager.py)."""
    torch._dynamo.config.capture_scalar_outputs = True
    try:
        def f(x, n):
            k = n.item()
            torch._check(k > 0)
            return (torch.ones(k) * x.sum()).sum()

        compiled = torch.compile(f, backend=fxflops.backend(inner="eager"))
        for k in (2, 3, 4):
            compiled(torch.randn(3), torch.tensor(k))
    finally:
        torch._dynamo.config.capture_scalar_outputs = False
    report = fxflops.recorder().to_dict()
    (entry,) = report["uninstrumented"]
    assert entry["calls"] == 3 and "tensor data" in entry["reason"]
    assert any("is not instrumented" in r.getMessage() for r in fxflops_log.records)


def _plan_of_a_class_gone() -> bytes:
    """A pickled object whose class's module no longer exists (fxflops moved it since)."""
    import types

    module = types.ModuleType("fxflops_plans_of_old")

    class GraphPlan:
        pass

    GraphPlan.__module__ = module.__name__
    GraphPlan.__qualname__ = "GraphPlan"
    module.GraphPlan = GraphPlan
    sys.modules[module.__name__] = module
    try:
        return pickle.dumps(GraphPlan())
    finally:
        del sys.modules[module.__name__]


@pytest.mark.parametrize("plan", ["not a plan", "a class gone"])
def test_an_artifact_whose_plan_cannot_be_used_runs_uninstrumented(plan, fxflops_log):
    """vLLM's cache holds an artifact whose fxflops part this process cannot use (not a
    plan; a plan that no longer unpickles): the inner artifact runs, counted, and the
    report says why."""
    from torch._dynamo.aot_compile_types import GraphModuleSerializableCallable

    from fxflops.instrument.wrap import InstrumentedGraph

    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    inner_state = GraphModuleSerializableCallable.serialize_compile_artifacts(
        GraphModuleSerializableCallable(gm))
    data = pickle.dumps({"inner_cls": "torch._dynamo.aot_compile_types:"
                                      "GraphModuleSerializableCallable",
                         "inner": inner_state, "name": "graph7", "meta": {},
                         "plan": _plan_of_a_class_gone() if plan == "a class gone" else plan})
    loaded = InstrumentedGraph.deserialize_compile_artifacts(data)
    x = torch.randn(2, 4)
    assert torch.equal(loaded(x), gm(x))
    (entry,) = fxflops.recorder().to_dict()["uninstrumented"]
    assert entry["name"] == "graph7" and entry["calls"] == 1


# --- environment --------------------------------------------------------------------------


def test_a_typo_in_a_setting_is_named_once(monkeypatch, fxflops_log, tmp_path):
    monkeypatch.setenv("FXFLOPS_OUTT", str(tmp_path))
    compiled = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"))
    compiled(torch.randn(2))
    compiled(torch.randn(3))
    messages = [r.getMessage() for r in fxflops_log.records if "FXFLOPS_OUTT" in r.getMessage()]
    assert len(messages) == 1 and "did you mean FXFLOPS_OUT?" in messages[0]


def test_prometheus_with_nowhere_to_write_says_so(monkeypatch, fxflops_log):
    monkeypatch.setenv("FXFLOPS_PROMETHEUS", "1")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("FXFLOPS_PROMETHEUS_DIR", raising=False)
    torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"))(torch.randn(2))
    fxflops.recorder().flush()
    assert any("nowhere to write the counters" in r.getMessage()
               for r in fxflops_log.records)


def test_the_call_path_reads_no_attribute_through_a_fallback():
    """Dynamo's wrapper reads the compiled callable's ``__name__`` on every call; a class
    ``__getattr__`` would run (and raise) there each time."""
    from fxflops.instrument.wrap import InstrumentedGraph

    compiled = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"))
    compiled(torch.randn(2))
    assert "__getattr__" not in vars(InstrumentedGraph)
    (graph,) = fxflops.recorder().graphs
    assert graph.name == "graph0"
    assert json.dumps(fxflops.recorder().stats())  # plain data


@pytest.mark.parametrize("plain,ours", [("eager", "fxflops(inner=eager)"),
                                        ("inductor", "fxflops")])
def test_a_call_through_torch_compile_adds_only_fxflops_own_step(plain, ours):
    """Per call, the Python functions that run under ``backend="fxflops"`` are those of the
    plain backend (the same Dynamo frames, the same generated forward: no
    ``nn.Module.__call__``), plus fxflops' own: the graph's ``__call__``
    (``wrap.InstrumentedGraph``, which Dynamo calls in place of the inner), its size key
    (a static graph's: the empty tuple, ``binder._no_key``), the call's number
    (``next``), and, as a size's first calls are each timed, ``_call_sampled``'s two clock
    reads and the sample's ``note`` under the row's lock. Counted by cProfile over 10
    calls."""
    import cProfile
    import pstats
    import re
    from collections import Counter

    def functions_called(backend) -> Counter:
        torch._dynamo.reset()
        f = torch.compile(lambda x: x * 2 + 1, backend=backend)
        x = torch.randn(8)
        # each compiled afresh (AOTAutograd's cache off): the second compile of this graph
        # would otherwise load the first's, and torch 2.11 wraps a fresh compile's forward
        # in one more function than a cached one
        with torch_compat.get("functorch_config").patch(enable_autograd_cache=False):
            f(x)
            f(x)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(10):
                f(x)
            prof.disable()
        return Counter({re.sub(r"(<eval_with_key>\.| #)\d+", r"\1N",  # FX's and fxflops'
                               f"{file.rsplit('/', 1)[-1]}:{name}"): stats[1]  # numbering
                        for (file, _, name), stats in pstats.Stats(prof).stats.items()})

    backend = fxflops.backend(inner="eager") if ours.endswith("eager)") else ours
    theirs, mine = functions_called(plain), functions_called(backend)
    assert theirs - mine == Counter(), theirs - mine
    assert mine - theirs == Counter({"wrap.py:__call__": 10, "binder.py:_no_key": 10,
                                     "~:<built-in method builtins.next>": 10,
                                     "wrap.py:_call_sampled": 10, "size_stats.py:note": 10,
                                     "~:<built-in method time.perf_counter_ns>": 20,
                                     "~:<method '__exit__' of '_thread.RLock' objects>": 10})
