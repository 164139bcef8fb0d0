"""Moved to mooncake_columnar/memory.py (the store's restore faults memory in too, and the store
sits below snapshots/); its names stay importable from here. Patch that module, not this one."""
from ..memory import FAULT_THREADS, MIN_FAULT_BYTES, FreeMemoryWarmer, free_memory_bytes, prefault, warm_free_memory

__all__ = ["FAULT_THREADS", "MIN_FAULT_BYTES", "FreeMemoryWarmer", "free_memory_bytes", "prefault",
           "warm_free_memory"]
