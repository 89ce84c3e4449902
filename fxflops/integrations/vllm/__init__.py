"""fxflops inside vLLM: see ``plugin`` (what loads) and ``hooks`` (what it changes)."""
