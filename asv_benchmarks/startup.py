"""Start-up: a fresh process's import, master, one mount and first put_start, put_end and
get_replica_list, with an empty Numba cache and with the cache that process left.

``setup_cache`` runs the fresh processes once per asv run (about 10 s on an idle 2-core host;
`mooncake-columnar bench startup` also times the warmup); the tracks report their seconds. The
same-run baseline is the import alone.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from mooncake_columnar.tools.bench_startup import first_call_figures

from ._common import TIMEOUT_S


class FirstCall:
    timeout = TIMEOUT_S

    def setup_cache(self) -> dict[str, float]:
        with tempfile.TemporaryDirectory(prefix="mooncake-asv-startup-") as tmp:
            return first_call_figures(Path(tmp))

    def track_import_seconds(self, figures: dict[str, float]) -> float:
        return figures["import_seconds"]

    def track_first_call_seconds_empty_cache(self, figures: dict[str, float]) -> float:
        return figures["first_call_seconds_empty_cache"]

    def track_first_call_seconds_filled_cache(self, figures: dict[str, float]) -> float:
        return figures["first_call_seconds_filled_cache"]

    def track_compile_helper_cpu_seconds_empty_cache(self, figures: dict[str, float]) -> float:
        """The CPU seconds of the first put's compile helper (compile_helper.py; 0 where none
        ran): the compile the empty-cache first call moved to a second core."""
        return figures.get("compile_helper_cpu_seconds_empty_cache", 0.0)

    track_import_seconds.unit = "seconds"  # type: ignore[attr-defined]
    track_compile_helper_cpu_seconds_empty_cache.unit = "seconds"  # type: ignore[attr-defined]
    track_first_call_seconds_empty_cache.unit = "seconds"  # type: ignore[attr-defined]
    track_first_call_seconds_filled_cache.unit = "seconds"  # type: ignore[attr-defined]
