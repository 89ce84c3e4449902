"""Where and when things are written: the session (the store with its outputs: flush,
exit, signals, fork), Prometheus counters and the annotated graph dumps.
"""
