"""fxflops inside vLLM: see ``plugin`` (what loads), ``hooks`` (what it changes),
``formulas`` (vLLM's ops, costed) and ``models`` (the layers vLLM's ops name)."""
