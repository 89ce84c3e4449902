#!/usr/bin/env python
"""The docs' console blocks, as the commands print them today.

A console block is a fenced block whose lines starting with ``$ `` are commands and whose
other lines are what the command above printed. This script runs each doc's commands in
order, as a reader following the page would (one fresh folder per page: ``fxflops demo``
writes ``fxflops-out`` there, ``fxflops report fxflops-out`` reads it), and writes what they
printed into the blocks, atomically (the page is replaced only once every command of it
succeeded). ``tests/test_docs_output.py`` runs the same commands through the same functions
and compares with ``differences``, which masks what must differ from one run to the next
(``TEXT_MASKS``, ``RUN_DEPENDENT_CELLS``: the one place those rules are kept).

    python scripts/regen_docs.py            # rewrite the blocks of DOCS
    python scripts/regen_docs.py --check    # exit 1 where a block differs beyond the masks
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # (run as a script: the checkout's tests/ and fxflops/)
from tests import procs  # noqa: E402  (subprocesses with a timeout and default signals)

DOCS = (ROOT / "docs" / "getting-started.md", ROOT / "README.md")

# rich's width for the commands' output. ``make_console`` gives a console that is not a
# terminal 180 columns (the commands' stdout is a pipe here), and a terminal COLUMNS: the
# same width either way, so lines wrap at the same places in the docs and in the test.
WIDTH = 180

# The demo's measurement runs (Inductor compiling 8 sizes) take about a minute on 2 cores;
# a loaded host several.
COMMAND_TIMEOUT = procs.TIMEOUT

# Environment that would change what the commands print, beyond the figures masked below:
# fxflops' own settings (FXFLOPS_OUT moves the demo's folder, FXFLOPS_PEAK_* replace the
# derived peak) and the variables that make rich emit colour codes or a terminal's width.
_DROPPED_PREFIXES = ("FXFLOPS_",)
_DROPPED = ("FORCE_COLOR", "NO_COLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
            "LINES")

# Figures in the commands' text (messages and table titles) that differ between runs or
# hosts, each replaced by a placeholder; everything else on those lines must match. Only
# these: a changed word, label or message is a difference.
_NUM = r"\d+(?:\.\d+)?"
TEXT_MASKS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), placeholder) for pattern, placeholder in (
        # the demo's first line: the installed torch and the threads it runs on
        (r"torch \d+\.\d+\S*, \d+ threads", "torch <version>, <n> threads"),
        # the peak's figures: the FLOP/s derived from this host's cores, clock and ISA, the
        # memory bandwidth measured (copy or triad, whichever was faster this time)
        (rf"{_NUM} TFLOP/s", "<n> TFLOP/s"),
        (rf"{_NUM} GB/s", "<n> GB/s"),
        (rf"\d+ core\(s\) x {_NUM} GHz \([^)]*\) x \d+ FLOP/cycle \([^)]*\)",
         "<n> core(s) x <n> GHz (<clock>) x <n> FLOP/cycle (<isa>)"),
        (r"measured \((?:copy|triad), \d+ thread\(s\)\)",
         "measured (<kernel>, <n> thread(s))"),
        # wall times
        (rf"\({_NUM} s, compile included\)", "(<n> s, compile included)"),
        # a run's files and id carry the host's name and the process's id (and start time)
        (r"fxflops-[^\s/]+-\d+\.json", "fxflops-<host>-<pid>.json"),
        (r"run [^\s:]+-\d+-\d+:", "run <host>-<pid>-<start>:"),
        (r"\(pid \d+\)", "(pid <pid>)"),
    ))

# Table cells whose value is a measurement (by the column's header, in any table): each
# must still read as that column's figure does (a pattern), so a changed format fails, but
# not its value. Headers, row labels and the columns of counts (graph, size, calls, FLOPs,
# bytes, FLOP/byte, the FlopCounterMode check) are compared exactly.
_FIGURE = r"-|0|\d{1,3}(?:,\d{3})*|\d+\.\d+|\d(?:\.\d+)?e[+-]\d+"  # fmt_num's forms
RUN_DEPENDENT_CELLS: dict[str, re.Pattern[str]] = {
    header: re.compile(pattern) for header, pattern in {
        "median ms": r"\d+\.\d{3}",
        "p90 ms": r"\d+\.\d{3}",
        "GFLOP/s": _FIGURE,
        "GB/s": _FIGURE,
        "MFU": r"-|\d+\.\d%",
        # from the measured peaks and the timings: which roof a size sits under
        "bound": r"-|memory|compute",
    }.items()}

_BOX = frozenset("┏┓┗┛┃━┳┻╋┡┩╇│─┌┐└┘├┤┬┴┼╭╮╰╯")
_TOP_LEFT = frozenset("┏┌╭")


@dataclasses.dataclass(frozen=True)
class Console:
    """One ``$ command`` of a doc's console block and the output the doc shows under it
    (``start``:``end``, its span in the page's text)."""

    command: str
    output: str
    start: int
    end: int


_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_SEGMENT = re.compile(r"^\$ (?P<command>[^\n]*)\n(?P<output>(?:(?!\$ )[^\n]*\n)*)", re.M)


def console_blocks(text: str) -> list[Console]:
    """The commands of ``text``'s console blocks (fenced blocks whose first line is a
    ``$ `` command), in the page's order."""
    found = []
    for fence in _FENCE.finditer(text):
        if not fence.group(1).startswith("$ "):
            continue  # a block of commands to type, not of what they print
        for seg in _SEGMENT.finditer(fence.group(1)):
            found.append(Console(seg.group("command").strip(), seg.group("output"),
                                 fence.start(1) + seg.start("output"),
                                 fence.start(1) + seg.end("output")))
    return found


def rewrite(text: str, consoles: Sequence[Console], outputs: Sequence[str]) -> str:
    """``text`` with each console's output replaced by the one printed, as printed (the
    blank lines around it aside): a line's trailing spaces included, which say where rich
    wrapped a line for want of room (``_soft_wrap``)."""
    for console, printed in sorted(zip(consoles, outputs), key=lambda c: -c[0].start):
        block = "".join(line + "\n" for line in printed.strip("\n").splitlines())
        text = text[:console.start] + block + text[console.end:]
    return text


def command_env(cache: str) -> dict[str, str]:
    """The environment each command runs in: this one without what changes the output
    (``_DROPPED``), the checkout's fxflops first on the path, rich at ``WIDTH`` columns, and
    a peak cache of its own (``cache``): the peak derived and its bandwidth measured as on
    a fresh host, not one ``fxflops peak --measure`` kept here."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(_DROPPED_PREFIXES) and name not in _DROPPED}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    env["COLUMNS"] = str(WIDTH)
    env["XDG_CACHE_HOME"] = cache
    return env


def argv(command: str) -> list[str]:
    """The argv of a doc's command: only ``fxflops ...`` is run (a page's console block
    is no place for arbitrary shell), by this interpreter (``python -m fxflops``, the
    console script's own entry), so the checkout's fxflops answers whatever is on PATH."""
    words = shlex.split(command)
    if words[:1] != ["fxflops"]:
        raise ValueError(f"console block command {command!r}: only fxflops commands are run")
    return [sys.executable, "-m", "fxflops", *words[1:]]


def run_commands(commands: Sequence[str], workdir: str | os.PathLike[str]) -> list[str]:
    """What each of ``commands`` printed on stdout, run in order in ``workdir`` (a fresh
    folder: the page's files, its peak cache). Raises RuntimeError at the first that fails,
    with the end of its stderr."""
    env = command_env(os.path.join(os.fspath(workdir), ".cache"))
    printed = []
    for command in commands:
        proc = procs.run(argv(command), timeout=COMMAND_TIMEOUT, cwd=workdir, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"`{command}` exited {proc.returncode}:\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        printed.append(proc.stdout)
    return printed


def _is_table(line: str) -> bool:
    return line[:1] in _BOX


def _centred(line: str, width: int) -> bool:
    """Whether ``line`` is one line of a title rich centred over a table ``width`` wide
    (rich puts ``(width - len) // 2`` spaces before each of its lines)."""
    text = line.strip()
    return (bool(text) and not _is_table(text) and len(text) <= width
            and len(line) - len(line.lstrip()) == (width - len(text)) // 2)


def _soft_wrap(line: str, following: str) -> bool:
    """Whether rich broke after ``line`` (as printed) only for want of room: the next
    line's first word would not have fit within ``WIDTH`` columns. rich places a word with
    the spaces after it and prints a wrapped line's trailing spaces (up to ``WIDTH``), so
    on its own output this is exact; a line whose trailing spaces an editor dropped is
    taken to have had one."""
    kept = line if line != line.rstrip() else line + " "
    return len(kept) + len(following.split()[0]) > WIDTH


def _masked_text(line: str) -> str:
    """A message (or title) as compared: its words, each run of spaces as one (a run where
    rich wrapped the line trails the line before, clipped at ``WIDTH``, and an editor may
    drop it: its width cannot be told from a wrapped copy), the figures of ``TEXT_MASKS``
    replaced."""
    line = " ".join(line.split())
    for pattern, placeholder in TEXT_MASKS:
        line = pattern.sub(placeholder, line)
    return line


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in re.split("[│┃]", row)[1:-1]]


def _table(rows: Sequence[str]) -> list[str]:
    """A rich table's lines as its structure and cells: a border by its junctions (the
    number of columns, not their widths: those follow the figures), a row by its cells
    (not their padding), each run-dependent cell masked if it reads as its column's figure
    does."""
    headers: list[str] = []
    out = []
    for row in rows:
        cells = _cells(row)
        if row[0] == "┃":  # the header (over several lines where a header wraps)
            headers = cells if not headers else [
                f"{a} {b}".strip() for a, b in zip(headers, cells)]
            out.append("┃ " + " ┃ ".join(cells) + " ┃")
        elif row[0] == "│":
            masked = []
            for i, cell in enumerate(cells):
                pattern = RUN_DEPENDENT_CELLS.get(headers[i] if i < len(headers) else "")
                masked.append(f"<{headers[i]}>" if pattern and pattern.fullmatch(cell)
                              else cell)
            out.append("│ " + " │ ".join(masked) + " │")
        else:
            out.append(re.sub("[━─═]+", "", row))
    return out


def masked(output: str) -> list[str]:
    """``output`` (a command's, or a doc's copy of it) as the lines compared: rich's soft
    wraps undone (a table's title as one line, a message wrapped at ``WIDTH`` as one line),
    tables as cells (``_table``), the figures of ``TEXT_MASKS`` replaced in the text."""
    printed = output.strip("\n").splitlines()
    lines = [line.rstrip() for line in printed]
    kinds = ["table" if _is_table(line) else "text" if line.strip() else "blank"
             for line in lines]
    for i, line in enumerate(lines):  # a table's title: the centred lines right above it
        if line[:1] in _TOP_LEFT:
            j = i - 1
            while j >= 0 and kinds[j] == "text" and _centred(lines[j], len(line)):
                kinds[j], j = "title", j - 1
    out: list[str] = []
    i = 0
    while i < len(lines):
        kind, j = kinds[i], i + 1
        if kind == "table":
            while j < len(lines) and kinds[j] == "table":
                j += 1
            out.extend(_table(lines[i:j]))
        elif kind == "title":
            while j < len(lines) and kinds[j] == "title":
                j += 1
            out.append(_masked_text(" ".join(line.strip() for line in lines[i:j])))
        elif kind == "text":
            text = lines[i]
            while j < len(lines) and kinds[j] == "text" and _soft_wrap(printed[j - 1], lines[j]):
                text, j = f"{text} {lines[j].strip()}", j + 1
            out.append(_masked_text(text))
        else:
            out.append("")
        i = j
    return out


def differences(shown: str, printed: str) -> str:
    """'' where a doc's block ``shown`` is what a command ``printed`` up to the masks; else
    the masked lines' unified diff (doc, then output)."""
    a, b = masked(shown), masked(printed)
    if a == b:
        return ""
    return "\n".join(difflib.unified_diff(a, b, "doc", "printed", lineterm=""))


def main(argv_: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare (as the test does); exit 1 where a block differs")
    parser.add_argument("docs", nargs="*", type=lambda p: Path(p).resolve(), default=list(DOCS),
                        help="pages to regenerate (default: %(default)s)")
    args = parser.parse_args(argv_)
    from fxflops.util import write_output

    stale = 0
    for doc in args.docs:
        name = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc
        text = doc.read_text()
        consoles = console_blocks(text)
        if not consoles:
            continue
        with tempfile.TemporaryDirectory(prefix="fxflops-docs-") as work:
            printed = run_commands([c.command for c in consoles], work)
        for console, out in zip(consoles, printed):
            diff = differences(console.output, out)
            if diff:
                stale += 1
                print(f"{name}: `$ {console.command}` differs:\n{diff}")
        if not args.check:
            new = rewrite(text, consoles, printed)
            if new != text:
                write_output(doc, new)  # a temporary file renamed over the page
            print(f"{name}: {len(consoles)} console block(s) written")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
