"""Which of fxflops' vLLM hooks resolve on the installed vLLM, feature by feature
(``fxflops/integrations/vllm/symbols.py``), before any test runs: the next release's gap
in one command. Exits 1 where the compile backend's own symbols (vLLM's compilation
interface) do not resolve: fxflops could record nothing there.

    python scripts/vllm_gap.py        (scripts/vllm_leg.sh prints it first)
"""

from __future__ import annotations

import sys


def main() -> int:
    import vllm

    from fxflops.integrations.vllm.symbols import COMPILE, FEATURES, SYMBOLS, resolve

    release = ".".join(vllm.__version__.split(".")[:2])
    print(f"vllm {vllm.__version__}: fxflops' hooks, feature by feature")
    off = {}
    for feature, info in FEATURES.items():
        problems = []
        for symbol in (s for s in SYMBOLS if s.feature == feature):
            try:
                resolve(symbol)
            except LookupError as e:
                problems.append(str(e))
        expected = info.absent.get(release)
        state = "on" if not problems else "OFF"
        note = f" (expected: {expected})" if expected and problems else \
            " (the table says absent here: update symbols.FEATURES)" if expected else ""
        print(f"  {feature:34} {state}{note}")
        for problem in dict.fromkeys(problems):
            print(f"      {problem}")
        if problems:
            off[feature] = problems
    return 1 if COMPILE in off else 0


if __name__ == "__main__":
    sys.exit(main())
