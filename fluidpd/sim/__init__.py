"""Discrete-event simulator, workloads and benchmarks."""
