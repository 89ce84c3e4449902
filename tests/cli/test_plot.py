"""``fxflops plot`` draws the peak ``fxflops report`` prints: the figure's artists (the two
roof lines, where they sit) and titles read back, for a recorded run with a CPU's derived
peak, the environment's, a GPU's table entry, half a peak and none at all."""

from __future__ import annotations

import json
import re

import pytest
import torch

import fxflops
from fxflops.cli import plot
from fxflops.cli.main import main

matplotlib = pytest.importorskip("matplotlib")


@pytest.fixture(autouse=True)
def own_peaks(tmp_path, monkeypatch):
    """No peak from the environment, and a peak cache of the test's own (what another test
    kept there, ``fxflops peak --measure``'s figure, must not become this run's peak)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FXFLOPS_PEAK_TFLOPS", raising=False)
    monkeypatch.delenv("FXFLOPS_PEAK_GBPS", raising=False)


def _record(tmp_path, device=None):
    """A real run's report (a linear at two sizes, three calls each), as if its graphs ran
    on ``device`` (None: this CPU)."""
    compiled = torch.compile(torch.nn.Linear(64, 64), backend=fxflops.backend(inner="eager"))
    with torch.no_grad():
        for n in (8, 8, 8, 32, 32, 32):
            compiled(torch.randn(n, 64))
    rec = fxflops.recorder()
    if device is not None:
        rec.info["device"] = device
    path = tmp_path / "fxflops-run.json"
    path.write_text(json.dumps(rec.to_dict(), default=str))
    return path


def _number(text):
    return None if text == "-" else float(text)


def _reported_peak(path, capsys):
    """(TFLOP/s, GB/s, source) as ``fxflops report`` prints them (its peak line)."""
    assert main(["report", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # (however the console wrapped it)
    found = re.search(r"peak: (\S+) TFLOP/s, (\S+) GB/s \[(.*?)\]", text)
    assert found, text
    return _number(found[1]), _number(found[2]), found[3]


def _plotted(path, monkeypatch, capsys, *flags):
    """The figure ``fxflops plot`` draws of ``path`` (as it is saved)."""
    figures = []
    save = plot._save

    def keep(plt, fig, output):
        figures.append(fig)
        save(plt, fig, output)

    monkeypatch.setattr(plot, "_save", keep)
    assert main(["plot", str(path), "-o", str(path.with_suffix(".png")), *flags]) == 0
    capsys.readouterr()
    (fig,) = figures
    return fig


def _roofs(ax):
    return {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}


def _check_roofs(ax, tflops, gbps):
    """Both roofs drawn, each where the peak puts it, meeting at the ridge, around the
    points."""
    roofs = _roofs(ax)
    assert sorted(roofs) == ["compute roof", "memory roof"]
    compute, memory = roofs["compute roof"], roofs["memory roof"]
    assert list(compute.get_ydata()) == pytest.approx([tflops * 1e3] * 2)  # GFLOP/s
    assert [y / x for x, y in zip(memory.get_xdata(), memory.get_ydata())] == \
        pytest.approx([gbps] * 2)  # GFLOP/s per FLOP/byte: GB/s
    ridge = tflops * 1e3 / gbps
    assert memory.get_xdata()[-1] == pytest.approx(ridge) == compute.get_xdata()[0]
    xs = [x for c in ax.collections for x, _ in c.get_offsets()]
    assert xs and memory.get_xdata()[0] < min(xs) and max(xs) < compute.get_xdata()[-1]


def _title(ax):
    return " ".join(ax.get_title().split())


def test_a_cpu_runs_plot_draws_both_roofs_at_the_derived_peak(tmp_path, monkeypatch, capsys,
                                                             request):
    from fxflops.peaks import cpu_bandwidth

    # the host's bandwidth kept, as any fxflops command keeps it (a recording process reads
    # it, never measures it); a cache of this test's own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_bandwidth, "_MAY_MEASURE", [True])
    cpu_bandwidth.host_bandwidth.cache_clear()
    request.addfinalizer(cpu_bandwidth.host_bandwidth.cache_clear)
    path = _record(tmp_path)
    tflops, gbps, source = _reported_peak(path, capsys)
    assert source.startswith("derived:") and tflops and gbps
    ax_roof = _plotted(path, monkeypatch, capsys).axes[2]
    _check_roofs(ax_roof, tflops, gbps)
    assert _title(ax_roof) == "roofline [derived]"


@pytest.mark.parametrize("device,env,label", [
    (None, {"FXFLOPS_PEAK_TFLOPS": "2.5", "FXFLOPS_PEAK_GBPS": "40"}, "env"),
    ("NVIDIA H100 80GB HBM3", {}, "H100 SXM"),
    ("NVIDIA H100 80GB HBM3", {"FXFLOPS_PEAK_GBPS": "40"}, "H100 SXM+env"),
])
def test_the_plots_roofs_are_the_reports_peak_and_its_title_says_whose(
        tmp_path, monkeypatch, capsys, device, env, label):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = _record(tmp_path, device)
    for name in env:  # the report keeps the peak it was recorded with: not read again
        monkeypatch.delenv(name)
    tflops, gbps, _ = _reported_peak(path, capsys)
    if "FXFLOPS_PEAK_GBPS" in env:
        assert gbps == 40.0
    ax_roof = _plotted(path, monkeypatch, capsys).axes[2]
    _check_roofs(ax_roof, tflops, gbps)
    assert _title(ax_roof) == f"roofline [{label}]"


@pytest.mark.parametrize("env,says", [
    ({}, "no peak known for NPU 9000 (no table entry, nothing measured): set "
         "FXFLOPS_PEAK_TFLOPS and FXFLOPS_PEAK_GBPS for the run"),
    ({"FXFLOPS_PEAK_TFLOPS": "2.5"}, "no memory-bandwidth peak known: set FXFLOPS_PEAK_GBPS "
                                     "for the run"),
    ({"FXFLOPS_PEAK_GBPS": "40"}, "no FLOP/s peak known: set FXFLOPS_PEAK_TFLOPS for the run"),
])
def test_with_no_peak_the_title_says_why_and_how_to_give_one(tmp_path, monkeypatch, capsys,
                                                             env, says):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = _record(tmp_path, "NPU 9000")  # a device no table knows, nothing measured
    tflops, gbps, _ = _reported_peak(path, capsys)
    assert not (tflops and gbps)
    ax_roof = _plotted(path, monkeypatch, capsys).axes[2]
    assert _roofs(ax_roof) == {}
    assert _title(ax_roof).startswith(f"roofline: {says}")
    assert "or run `fxflops peak --measure` on its host" in _title(ax_roof)


def _kernel_reports(peak):
    kernels = [{"kernel": "cpp_fused_add_0", "median_ms": 0.01, "bytes": 4096, "flops": 1024},
               {"kernel": "extern_kernels.mm", "median_ms": 0.05, "bytes": 65536,
                "flops": 2 * 64 ** 3}]
    return [{"peak": peak, "process": {"device": "NPU 9000"},
             "graphs": [{"name": "graph0", "rows": [{"size": 64, "kernels": kernels}]}]}]


def test_the_kernels_roofline_uses_the_same_peak_and_says_whose():
    import matplotlib.pyplot as plt

    derived = {"tflops": 0.27, "gbps": 8.4, "source": "derived: 2 core(s) x 2.10 GHz (...)"}
    fig = plot.kernels_figure(plt, _kernel_reports(derived))
    (ax,) = fig.axes
    _check_roofs(ax, 0.27, 8.4)
    assert _title(ax) == "kernels against the roofline [derived]"
    fig = plot.kernels_figure(plt, _kernel_reports({"tflops": None, "gbps": None,
                                                    "source": "none"}))
    (ax,) = fig.axes
    assert _roofs(ax) == {}
    assert _title(ax).startswith("kernels against the roofline: no peak known for NPU 9000")
    plt.close("all")
