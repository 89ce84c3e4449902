"""``fxflops tune`` on one run: traffic, time curves, a budget (fxflops.tuning)."""

from __future__ import annotations

import json

import pytest

from fxflops.cli.main import main
from fxflops.report.tuning import CAPTURED, GENERAL, SPECIALISED, Served, recommend
from tests import procs


def forward_row(size, calls, median_ms, scheduled, captured=0):
    return {"size": size, "key": [size], "calls": calls, "total_ms": median_ms * calls,
            "median_ms": median_ms, "p10_ms": median_ms, "p90_ms": median_ms,
            "flops": 1000 * size, "matmul_flops": 1000 * size, "runtime_flops": 0,
            "bytes_io": 10, "scheduled": {str(n): c for n, c in scheduled.items()},
            "captured": captured}


def write_run(path, forward, graphs=()):
    data = {"schema": "fxflops.report/1", "run": {"id": "one-run"},
            "process": {"pid": 1, "rank": None}, "peak": {}, "graphs": list(graphs),
            "forward": forward}
    path.write_text(json.dumps(data))
    return path


def captured_run(tmp_path):
    """Captured sizes 4, 8, 16 (time 1 + 0.1 x ms); steps of 3, 5, 6 and 16 tokens padded
    up to them: 100 x 3 -> 4, 50 x 5 and 50 x 6 -> 8, 10 x 16 -> 16."""
    def t(x):
        return 1 + 0.1 * x

    return write_run(tmp_path / "run.json", [
        forward_row(4, 100, t(4), {3: 100}, captured=100),
        forward_row(8, 100, t(8), {5: 50, 6: 50}, captured=100),
        forward_row(16, 10, t(16), {16: 10}, captured=10)])


def hand_best(budget):
    """The optimum by brute force over every set of scheduled sizes covering 16."""
    from itertools import combinations

    traffic = {3: 100, 5: 50, 6: 50, 16: 10}

    def time(x):  # measured at 4, 8, 16; below 4 a step takes what size 4 took
        return 1 + 0.1 * max(x, 4)

    def cost(chosen):
        return sum(c * time(min(s for s in chosen if s >= n)) for n, c in traffic.items())

    options = [set(c) | {16} for k in range(budget) for c in combinations([3, 5, 6], k)]
    best = min(options, key=cost)
    return sorted(best), cost(best) / 210


@pytest.mark.parametrize("budget,expected", [(2, [6, 16]), (3, [3, 6, 16])])
def test_capture_sizes_known_optimum(tmp_path, capsys, budget, expected):
    assert hand_best(budget)[0] == expected  # by hand: {6, 16}: 320 + 26; {3, 6, 16}: 326
    path = captured_run(tmp_path)
    assert main(["tune", str(path), "--max-sizes", str(budget)]) == 0
    out = capsys.readouterr().out
    assert f"-cc '{json.dumps({'cudagraph_capture_sizes': expected})}'" in out
    served = [Served(4, 100, 1.4, CAPTURED, {3: 100}), Served(8, 100, 1.8, CAPTURED, {5: 50, 6: 50}),
              Served(16, 10, 2.6, CAPTURED, {16: 10})]
    rec = recommend(served, budget)
    assert rec.sizes == expected
    assert rec.expected_ms == pytest.approx(hand_best(budget)[1])
    # as run: 100 x 1.4 + 100 x 1.8 + 10 x 2.6 over 210 steps; each size's saving adds up
    assert rec.now_ms == pytest.approx((140 + 180 + 26) / 210)
    assert sum(rec.gains_ms.values()) == pytest.approx(rec.now_ms - rec.expected_ms)


def test_compile_sizes_from_specialised_and_general_sizes():
    # general graph: 2 ms + 0.5 ms per token; sizes 2 and 8 specialised at half the time
    served = [Served(1, 500, 2.5, GENERAL, {1: 500}), Served(2, 50, 1.5, SPECIALISED, {2: 50}),
              Served(4, 300, 4.0, GENERAL, {4: 300}), Served(8, 5, 3.0, SPECIALISED, {8: 5})]
    rec = recommend(served, 1)
    # specialised: 1.5 ms at 2, 3.0 at 8, so 2.0 at 4 (interpolated), 1.5 at 1 (below 2);
    # size 4 saves 300 x (4.0 - 2.0), more than size 1 saves: 500 x (2.5 - 1.5)
    assert rec.mode == "compile" and rec.sizes == [4] and rec.cc == {"compile_sizes": [4]}
    assert rec.gains_ms[4] == pytest.approx(300 * (4.0 - 2.0) / 855)


def test_thin_data_is_said_plainly(tmp_path, capsys):
    path = write_run(tmp_path / "run.json", [forward_row(1, 8, 2.0, {1: 8}),
                                              forward_row(5, 4, 3.0, {5: 4})])
    assert main(["tune", str(path), "--max-sizes", "1"]) == 0
    out = capsys.readouterr().out
    assert "cannot tell what a specialised or captured graph would save" in out
    assert "only 12 forwards" in out
    assert "-cc '{\"compile_sizes\": [1]}'" in out  # 8 x 2.0 ms carries more time than 4 x 3.0


def test_replicas_add_traffic_and_shards_wait_for_the_slowest(tmp_path, capsys):
    """dp 2 x tp 2: a replica's size takes its slowest shard's median; replicas each served
    their own steps, so their calls and scheduled tokens add (numbers by hand)."""
    times = {(0, 0): 1.4, (0, 1): 1.5, (1, 0): 1.6, (1, 1): 1.6}
    for (dp, tp), ms in times.items():
        steps = 100 if dp == 0 else 50
        path = write_run(tmp_path / f"r{dp}{tp}.json", [
            forward_row(4, steps, ms, {3: steps}, captured=steps),
            forward_row(8, 10, 2 * ms, {8: 10}, captured=10)])
        data = json.loads(path.read_text())
        data["process"] = {"pid": 10 + 2 * dp + tp, "rank": 2 * dp + tp,
                           "ranks": {"dp": dp, "dp_size": 2, "tp": tp, "tp_size": 2}}
        path.write_text(json.dumps(data))
    from fxflops.report.files import load_reports
    from fxflops.report.tuning import served_sizes

    by_size = {s.size: s for s in served_sizes(load_reports([str(tmp_path)]))}
    assert by_size[4].calls == 150 and by_size[4].scheduled == {3: 150}
    assert by_size[4].median_ms == pytest.approx((1.5 * 100 + 1.6 * 50) / 150)
    assert by_size[8].calls == 20 and by_size[8].median_ms == pytest.approx(3.1)
    assert main(["tune", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "merged (2 shard(s) x 1 stage(s) x 2 replica(s))" in out
    assert "replicas' traffic added" in out


@pytest.mark.parametrize("forward,message", [
    ([], "served nothing"),
    ([forward_row(4, 10, 1.0, {4: 10})], "one size only"),
    ([forward_row(1, 3, 0.0, {1: 3}), forward_row(2, 3, 0.0, {2: 3})], "no timings")])
def test_bad_runs_are_one_line_exit_2(tmp_path, forward, message):
    import sys

    path = write_run(tmp_path / "run.json", forward)
    proc = procs.run([sys.executable, "-m", "fxflops.cli.main", "tune", str(path)],
                     timeout=120)
    assert proc.returncode == 2, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
