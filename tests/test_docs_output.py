"""The docs' console blocks are what their commands print today (issue 49): the commands of
docs/getting-started.md (and any console block of the README) run on a fresh demo and
compared, through scripts/regen_docs.py's own functions and masks, with what the pages
show. ``python scripts/regen_docs.py`` rewrites the blocks when the tool's output changes."""

from __future__ import annotations

import importlib.util
import io
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console
from rich.markup import escape
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regen_docs", ROOT / "scripts" / "regen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up there)
    spec.loader.exec_module(module)
    return module


regen_docs = _load_script()
CONSOLES = {doc: regen_docs.console_blocks(doc.read_text()) for doc in regen_docs.DOCS}
CASES = [(doc, i) for doc, consoles in CONSOLES.items() for i in range(len(consoles))]
GETTING_STARTED = ROOT / "docs" / "getting-started.md"


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, list[str]]:
    """Each page's commands run once, in the page's order, in a fresh folder of its own
    (one demo run, about a minute on 2 cores, shared by every comparison of the page)."""
    return {doc: regen_docs.run_commands([c.command for c in consoles],
                                         tmp_path_factory.mktemp(doc.stem))
            for doc, consoles in CONSOLES.items() if consoles}


def test_getting_started_shows_the_newcomers_commands() -> None:
    # the comparisons below cover the commands a newcomer types first: were the page's
    # blocks not found (a changed fence), nothing would be compared
    commands = [c.command for c in CONSOLES[GETTING_STARTED]]
    assert commands[:3] == ["fxflops demo", "fxflops report fxflops-out",
                            "fxflops plot fxflops-out -o demo.png"], commands


@pytest.mark.parametrize("doc,index", CASES,
                         ids=[f"{doc.name}:{CONSOLES[doc][i].command}" for doc, i in CASES])
def test_console_block_is_what_the_command_prints(doc: Path, index: int,
                                                   printed: dict[Path, list[str]]) -> None:
    shown = CONSOLES[doc][index]
    diff = regen_docs.differences(shown.output, printed[doc][index])
    assert not diff, (f"{doc.relative_to(ROOT)}: `$ {shown.command}` prints otherwise than "
                      f"the page shows (masked lines; `python scripts/regen_docs.py` "
                      f"rewrites the blocks):\n{diff}")


# -- the comparer itself, on rich's own rendering (no demo run) --

PEAK = ("peak: {tflops} TFLOP/s, {gbps} GB/s [derived: 2 core(s) x {ghz} GHz (current clock) "
        "x 64 FLOP/cycle (avx512); {gbps} GB/s measured ({kernel}, 2 thread(s))]")


def report_like(median: str = "0.618", mfu: str = "4.6%", bound: str = "memory",
                gflops: str = "0.00766", tflops: str = "0.2688", gbps: str = "7.81",
                ghz: str = "2.10", kernel: str = "triad", pid: str = "30830",
                label: str = "graph1", header: str = "median ms",
                message: str = "8 rows; bytes (I/O) per call summed over rows: 65.8 MB") -> str:
    """Output shaped as ``fxflops report``'s, rendered by rich at the commands' width: a
    title long enough to wrap over the table, measured cells, a message line."""
    table = Table(title=escape(f"fxflops: run vm-{pid}-1796570732: 1 report(s) (pid {pid}); "
                               + PEAK.format(tflops=tflops, gbps=gbps, ghz=ghz, kernel=kernel)))
    for col in ("graph", "size", header, "GFLOPs", "MFU", "bound"):
        table.add_column(col, justify="left" if col == "graph" else "right")
    table.add_row(label, "2x16", median, gflops, mfu, bound)
    table.add_row("graph2", "2x128", "90.862", "1.05", "43.2%", "compute")
    out = io.StringIO()
    console = Console(file=out, width=regen_docs.WIDTH, color_system=None)
    console.print(table)
    console.print(message)
    console.print(f"report: fxflops-out/fxflops-vm-{pid}.json  (12.1 s, compile included) "
                  "and enough words after it to need a second line at this width: " * 2)
    return out.getvalue()


def test_run_dependent_figures_are_masked() -> None:
    base = report_like()
    other = report_like(median="1234.567", mfu="99.9%", bound="compute", tflops="12.5",
                        gbps="123.45", ghz="3.70", kernel="copy", pid="7")
    # the figures' widths moved the columns and the title's wrap: same up to the masks
    assert base.splitlines()[0] != other.splitlines()[0]
    assert regen_docs.differences(base, other) == ""


@pytest.mark.parametrize("change", [
    {"label": "graph9"},  # a row label
    {"header": "median us"},  # a column's header
    {"gflops": "0.00767"},  # a cell of a count (deterministic)
    {"bound": "neither"},  # a measured cell no longer reads as its column's figure
    {"message": "8 rows; bytes (I/O) per call summed over rows: 65.9 MB"},
])
def test_a_changed_label_cell_or_message_fails(change: dict[str, str]) -> None:
    diff = regen_docs.differences(report_like(), report_like(**change))
    assert diff and next(iter(change.values())) in diff, diff


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1, f"{old!r} is not in the page's block"
    return text.replace(old, new, 1)


@pytest.mark.parametrize("old,new", [
    ("matmul GFLOPs", "matmul GFLOP"),  # a column's label
    ("All match.", "All matched."),  # a message
    ("layers.0.mlp", "layers.0.ffn"),  # a row label
])
def test_the_pages_demo_block_with_one_label_changed_fails(old: str, new: str) -> None:
    shown = CONSOLES[GETTING_STARTED][0].output
    assert regen_docs.differences(shown, shown) == ""
    diff = regen_docs.differences(_replace_once(shown, old, new), shown).splitlines()
    # the page's line (changed) against the output's (as it was)
    assert any(line.startswith("-") and not line.startswith("---") and new in line
               for line in diff), diff
    assert any(line.startswith("+") and not line.startswith("+++") and old in line
               for line in diff), diff


def test_rewrite_replaces_only_the_outputs() -> None:
    page = ("# t\n\n```bash\nfxflops demo   # typed, not run\n```\n\n"
            "```\n$ fxflops demo\nold output\n  old line 2\n$ fxflops report out\n```\n"
            "tail\n")
    consoles: Sequence = regen_docs.console_blocks(page)
    assert [c.command for c in consoles] == ["fxflops demo", "fxflops report out"]
    new = regen_docs.rewrite(page, consoles, ["\nnew 1   \nnew 2\n\n", "report\n"])
    assert new == ("# t\n\n```bash\nfxflops demo   # typed, not run\n```\n\n"
                   "```\n$ fxflops demo\nnew 1   \nnew 2\n$ fxflops report out\nreport\n```\n"
                   "tail\n")


def test_only_fxflops_commands_run() -> None:
    with pytest.raises(ValueError, match="only fxflops commands"):
        regen_docs.argv("rm -rf fxflops-out")
    assert regen_docs.argv("fxflops plot fxflops-out -o demo.png")[-4:] == [
        "plot", "fxflops-out", "-o", "demo.png"]


def test_the_commands_environment_is_a_fresh_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FXFLOPS_PEAK_TFLOPS", "1000")
    monkeypatch.setenv("FORCE_COLOR", "1")
    env = regen_docs.command_env("/tmp/cache-of-its-own")
    assert "FXFLOPS_PEAK_TFLOPS" not in env and "FORCE_COLOR" not in env
    assert env["XDG_CACHE_HOME"] == "/tmp/cache-of-its-own"
    assert env["COLUMNS"] == str(regen_docs.WIDTH)
