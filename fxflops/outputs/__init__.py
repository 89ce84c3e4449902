"""Where and when things are written: the recorder's sinks (the report files and their
periodic flush, Prometheus counters, the annotated graph dumps), attached by the session
(``session.attach``), and the process around them: exit, signals, fork.
"""
