"""What the hot path touches: the store of graphs and per-size rows (``store``), each row's
bounded statistics (``size_stats``), the CUDA-event clock (``cuda_events``), warm-up
phases (``phases``), run-time costs (``runtime_costs``) and per-kernel profiling
(``kernel_profile``). Nothing here writes a file or formats a figure.
"""
