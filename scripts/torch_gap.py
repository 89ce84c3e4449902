"""What the installed torch has of what fxflops reads or adds, before any test runs:
each private torch API of ``fxflops/torch_compat.py`` (resolves or not), and which of
fxflops' added matmul formulas (``fxflops.cost.formulas.aten.TORCH_EXTRAS``) torch's own
registry now has (there, torch's formula is the one used).

    python scripts/torch_gap.py        (scripts/torch_leg.sh prints it first)
"""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    from fxflops import torch_compat
    from fxflops.cost.formulas import aten

    print(f"torch {torch.__version__}: fxflops' private torch APIs "
          f"(checked with {', '.join(torch_compat.CHECKED_WITH)})")
    missing = 0
    for key, entry in sorted(torch_compat.PRIVATES.items()):
        try:
            torch_compat.get(key)
            state = "ok"
        except AttributeError as e:
            state = "absent (optional)" if entry.optional else f"MISSING: {e}"
            missing += not entry.optional
        print(f"  {key:24} {entry.module}{'.' if entry.name else ''}{entry.name}: {state}")
    lacks = set(aten.torch_lacks())
    print("fxflops' added matmul formulas (used only where torch's registry lacks the op):")
    for name in aten.TORCH_EXTRAS:
        print(f"  {name}: " + ("fxflops' (torch lacks it)" if name in lacks
                               else "torch's own (torch now counts it)"))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
