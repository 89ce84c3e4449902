"""fxflops: FLOPs, time per size and MFU of the graphs torch.compile and vLLM run.

Commands: demo, report, compare, tune, plot, peak. Bad input or a bad argument gets one line
on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from fxflops.report.schema import ReportError

EXIT_BAD_INPUT = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one line (no usage block) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} -h)\n")


def build_parser() -> argparse.ArgumentParser:
    from fxflops.cli import compare, demo, peak, plot, report, trace, tune

    parser = OneLineParser(prog="fxflops", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for module in (demo, report, compare, tune, plot, trace, peak):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from fxflops.peaks.cpu_bandwidth import allow_measuring

    allow_measuring()  # (a process started to make figures: it may measure the CPU's)
    try:
        return int(args.func(args) or 0)
    except (ReportError, OSError, ValueError, ImportError, MemoryError) as e:
        print(f"fxflops {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug of ours: still one line, never a traceback
        print(f"fxflops {args.command}: internal error: {type(e).__name__}: {_one_line(e)}",
              file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
