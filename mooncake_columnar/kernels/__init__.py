"""Numba kernels: pure functions over arrays and scalars (no clock, config, logging or metrics)."""
