"""Compile time: the backend (``backend``, ``entry_points``), the plan and the one way a
graph gets instrumented (``plan``, ``wrap``), training steps' AOTAutograd graphs
(``autograd``), Inductor's kernel map (``provenance``) and torch.distributed's hooks
(``distributed_hooks``).
"""
