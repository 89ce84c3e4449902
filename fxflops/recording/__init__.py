"""The process's recorder (``recorder``: graphs, rows, whole forwards, its sinks by
composition) and what the hot path touches: the graphs' records and their rows (``store``),
each row's bounded statistics (``size_stats``), the CUDA-event clock (``cuda_events``) and
when its samples are collected (``collection``), warm-up phases (``phases``) and scopes
(``scopes``), run-time costs (``runtime_costs``) and per-kernel profiling
(``kernel_profile``). Nothing here writes a file or formats a figure.
"""
