"""The pure FluidPD core.

Everything in this package is deterministic logic over values that are passed in: no network,
no files, no clock of its own (``now`` is always an argument, in seconds on the caller's
clock). The simulator, the live sidecars and the GPU backend all import this package; none of
them re-implements any of it.
"""
