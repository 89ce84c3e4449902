"""Hardware peaks: what a device can do at most, the roof every rate is read against.

``devices``: the vendors' dense figures per device and dtype, and the peak this process
uses (``current_peak``); ``cpu``: a CPU's FLOP/s peak derived from its ISA, cores and
clock; ``cpu_bandwidth``: its memory bandwidth, measured once per host; ``cache``: what was
measured of this host's devices, kept for later runs; ``of_run``: the peak a run's reports
are read against.
"""
