"""fxflops: FLOPs, time per size and MFU of the graphs torch.compile and vLLM run.

Commands: demo, report, compare, tune, plot, peak. Bad input gets one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from fxflops.report import ReportError

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    from fxflops.cli import compare, demo, peak, plot, report, tune

    parser = argparse.ArgumentParser(prog="fxflops", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (demo, report, compare, tune, plot, peak):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ReportError as e:
        print(f"fxflops {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (OSError, ValueError) as e:
        print(f"fxflops {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
