"""The report format and what reads it: building a report from the store (``build``), what
its numbers mean (``figures``, ``peaks``), its schema and files (``schema``, ``files``),
flattening and merging many (``rows``, ``merge``), training steps (``steps``) and the
compile-size advice (``tuning``).
"""
