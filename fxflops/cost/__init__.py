"""The cost model: what a graph costs, from the graph alone.

Pure and picklable: no clock, no store, no files. ``analysis`` walks an FX graph and
writes each node's cost into ``node.meta`` (``graph_cost``'s types, exact ints or sympy
expressions of the size symbols); ``formulas`` holds every built-in formula, registered in
``registry`` by importing the package; ``binder`` reads the size symbols from a call's
arguments; ``layer_check`` is the safety net (layers checked against their own sizes);
``kernels`` shares a graph's cost among the kernels Inductor made of it.
"""
