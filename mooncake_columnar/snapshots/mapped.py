"""Moved to mooncake_columnar/mapped.py (the store's restore lets mapped pages go too, and the
store sits below snapshots/); its names stay importable from here."""
from ..mapped import map_file, release_mapped

__all__ = ["map_file", "release_mapped"]
