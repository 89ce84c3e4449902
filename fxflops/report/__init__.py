"""The report format and what reads it: building a report from the recorder (``build``),
what its numbers mean (``figures``, ``peaks``: ``fxflops.peak``), its schema, typed rows and
files (``schema``, ``files``), flattening and merging many (``rows``, ``merge``), training
steps (``steps``), the compile-size advice (``tuning``), and a scope's own report
(``scope``: ``fxflops.scope``).
"""
