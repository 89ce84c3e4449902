"""``python -m fxflops``: the ``fxflops`` command."""

from fxflops.cli.main import main

raise SystemExit(main())
