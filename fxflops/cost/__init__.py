"""The cost model: what a graph costs, from the graph alone.

Pure and picklable: no clock, no store, no files, and no serving engine: an engine's ops
are formulated by its integration, which registers them here, and the layers an engine
keeps are described by its integration too (by their sizes) and handed in by the caller.
``analysis`` walks an FX graph and writes each node's cost into ``node.meta``
(``graph_cost``'s types, exact ints or sympy expressions of the size symbols);
``registry`` maps ops to formulas; ``formulas`` holds the engine-neutral built-in ones,
registered by importing the package; ``binder`` reads the size symbols from a call's
arguments; ``layer_check`` is the safety net (the layers the caller describes checked
against their own sizes); ``kernels`` shares a graph's cost among the kernels Inductor
made of it.
"""
