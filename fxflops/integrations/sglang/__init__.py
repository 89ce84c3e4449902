"""fxflops inside SGLang: see ``plugin`` (what SGLang loads, and what it changes),
``compiles`` (SGLang's decode compiles under fxflops' backend) and ``estimate`` (SGLang's own
FLOPs estimate, ``--enable-mfu-metrics``, kept beside the measured rows)."""
