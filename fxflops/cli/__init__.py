"""The ``fxflops`` command line."""
