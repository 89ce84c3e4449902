"""Report files: their names (one per process, a started-file beside it), atomic writes,
and loading one file or a folder of them (validated, the newest per process, missing
reports named).
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxflops.placement import placement
from fxflops.report.schema import ReportError, validate
from fxflops.util import atomic_text

if TYPE_CHECKING:
    pass




def run_id(report: dict[str, Any]) -> str:
    """The run a report belongs to (reports from before run ids: one run per file)."""
    run = report.get("run") or {}
    return str(run.get("id") or report.get("_path", "?"))


def write_atomic(data: dict[str, Any], path: str | os.PathLike[str]) -> str:
    # compact: json's C encoder (indenting takes its pure-Python path, several times
    # slower on a report of thousands of sizes, and it runs beside the host's work)
    return atomic_text(json.dumps(data, separators=(",", ":"), default=str), path)


# a report of every size of a large piecewise model is tens of MB; past this, it is none
MAX_REPORT_BYTES = 512 << 20




def _too_large(p: Path) -> ReportError:
    return ReportError(f"{p}: larger than {MAX_REPORT_BYTES >> 20} MiB: not a report")


def _check_file(p: Path) -> None:
    """Refuse, from its metadata alone, what is no report: a folder; a FIFO or a device
    (reading would block, or never end); a file past the size cap (refused unread)."""
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ReportError(f"{p}: no such file") from None
    except OSError as e:
        raise ReportError(f"{p}: cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ReportError(f"{p}: is a folder (pass it to load_reports)")
    if not stat.S_ISREG(st.st_mode):
        raise ReportError(f"{p}: not a regular file")
    if st.st_size > MAX_REPORT_BYTES:
        raise _too_large(p)


def read_json(path: str | os.PathLike[str]) -> Any:
    """A JSON file fxflops may read: a regular file, under the size cap, valid JSON."""
    p = Path(path)
    _check_file(p)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_REPORT_BYTES + 1)  # it may have grown since it was looked at
    except OSError as e:
        raise ReportError(f"{p}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_REPORT_BYTES:
        raise _too_large(p)
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        raise ReportError(f"{p}: empty file")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "too deep"
        raise ReportError(f"{p}: not valid JSON (truncated?): {msg}") from None
    except ValueError:  # an integer past Python's digit limit for conversions
        raise ReportError(f"{p}: not valid JSON: a number too long to read") from None


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate one report file; a ReportError says in one line what is wrong."""
    data = read_json(path)
    validate(data, str(path))
    data["_path"] = str(path)
    return data


def is_export(data: Any) -> bool:
    """What fxflops writes beside reports that is not one: ``report --json`` rows (a list),
    or another fxflops schema."""
    return isinstance(data, list) or (
        isinstance(data, dict) and str(data.get("schema", "")).startswith("fxflops.")
        and not str(data["schema"]).startswith("fxflops.report/"))


def load_reports(paths: Iterable[str | os.PathLike[str]],
                 skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Files, or folders of ``*.json`` reports (non-recursive, ``graphs/`` dumps skipped).

    A folder is read file by file: with ``skipped`` given, a bad file in it is listed there
    (one line each) and the good ones are still returned; without, the first bad one
    raises. So is a process that started recording there (its started-file) and wrote no
    report (killed before its first flush). Exports fxflops wrote there (``report --json``)
    are not reports and are passed over. A file named on its own must be a good report.
    """
    reports = []
    for path in paths:
        p = Path(path)
        if not p.is_dir():
            reports.append(load_report(p))
            continue
        files = sorted(f for f in p.glob("*.json") if not f.name.startswith("."))
        found = 0
        for f in files:
            try:
                data = read_json(f)
                if is_export(data):
                    continue
                found += 1
                validate(data, str(f))
                data["_path"] = str(f)
                reports.append(data)
            except ReportError as e:
                if skipped is None:
                    raise
                skipped.append(str(e))
        if not found:
            raise ReportError(f"{p}: no report files (*.json) in this folder")
        if skipped is not None:
            skipped += _missing_reports(p, reports)
    if not reports:
        raise ReportError("no readable report among " + ", ".join(map(str, paths)))
    return _latest_per_process(reports)


def _missing_reports(folder: Path, reports: list[dict[str, Any]]) -> list[str]:
    """A line per process that started recording into ``folder`` and wrote no report."""
    written = {(r["process"].get("host"), r["process"].get("pid")) for r in reports}
    lines = []
    for f in sorted(folder.glob(f"*{STARTED}")):
        try:
            info = json.loads(f.read_text())
            key = (info.get("host"), info.get("pid"))
        except (OSError, ValueError, AttributeError):
            continue
        if key not in written:
            lines.append(f"{f}: process {key[1]} on {key[0]} started recording here and wrote "
                         "no report (killed before its first flush?)")
    return lines


def _latest_per_process(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per process: a copy saved elsewhere by the same process is not a rank."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rep in reports:
        p = rep["process"]
        key: tuple[Any, ...] = (run_id(rep), p.get("host"), p.get("pid"), p.get("rank"))
        if p.get("pid") is None:
            key = (rep["_path"],)
        old = latest.get(key)
        if old is None or os.path.getmtime(rep["_path"]) >= os.path.getmtime(old["_path"]):
            latest[key] = rep
    return list(latest.values())




def process_rank(info: dict[str, Any] | None = None) -> int | None:
    """This process's global rank (``placement``), None outside a parallel job."""
    return placement(info or {}).get("rank")


def report_filename(info: dict[str, Any]) -> str:
    rank = process_rank(info)
    suffix = f"-rank{rank}" if rank is not None else ""
    return f"fxflops-{socket.gethostname()}-{os.getpid()}{suffix}.json"


STARTED = ".started"


def started_filename() -> str:
    """This process's started-file (see ``outputs.report_files``): a report that never
    came is named."""
    return f"fxflops-{socket.gethostname()}-{os.getpid()}{STARTED}"


