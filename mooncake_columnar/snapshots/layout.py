"""Where a snapshot repository keeps its files, and the one check of every path part.

Layout (upstream's): ``<root>/<cluster_id>/<snapshot_id>/<payload>``, ``.../manifest.txt`` and
``<root>/<cluster_id>/latest.txt``. Every path the repository builds, for reading, writing and
deleting, is made of parts :func:`check_path_part` accepted.
"""
from __future__ import annotations

import re

from ..errors import InvalidParams
from .arrow_codec import DIGEST_FILE, OPTIONAL_PAYLOAD_FILES, PAYLOAD_FILES
from .manifest import MANIFEST_FILE, is_valid_snapshot_id

LATEST_FILE = "latest.txt"
DEFAULT_CLUSTER_ID = "mooncake_cluster"
SAVE_BACKUP_DIR = "mooncake_snapshot_save_backup"
# Upstream v1 payloads (mooncake_v1 imports this module, so the names are spelled here; a test
# checks they equal mooncake_v1.V1_FILES / DESCRIPTOR_FILE).
V1_PAYLOAD_FILES = ("metadata", "segments", "task_manager")
V1_DESCRIPTOR_FILE = "descriptor.txt"
# Every file name a snapshot directory may hold (v2, standby, v1), and the cluster directory's.
SNAPSHOT_FILES = frozenset({MANIFEST_FILE, DIGEST_FILE, *PAYLOAD_FILES, *OPTIONAL_PAYLOAD_FILES,
                            *V1_PAYLOAD_FILES, V1_DESCRIPTOR_FILE})
CLUSTER_FILES = frozenset({LATEST_FILE})
# Upstream's cluster id rule; "." and ".." are excluded on top of it (they are path steps).
_CLUSTER_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")

# Small files are read with a size cap: a hostile multi-GB latest.txt must not be downloaded.
MAX_MANIFEST_BYTES = 4096
MAX_LATEST_BYTES = 4096
MAX_DIGEST_BYTES = 1 << 20



def check_path_part(kind: str, value: object) -> str:
    """The one validation of every path component this repository builds; returns ``value``.

    ``kind``: ``"cluster_id"`` (upstream ``^[A-Za-z0-9_.-]{1,128}$``, not ``.``/``..``),
    ``"snapshot_id"`` (``YYYYMMDD_HHMMSS_mmm``, ASCII digits: the format the writers generate),
    ``"file"`` (a name from :data:`SNAPSHOT_FILES`) or ``"cluster_file"`` (``latest.txt``).
    Raises :class:`InvalidParams` otherwise: nothing built from these parts can leave the
    cluster directory.
    """
    if kind == "cluster_id":
        ok = isinstance(value, str) and _CLUSTER_ID.fullmatch(value) is not None \
            and value not in (".", "..")
        rule = "1-128 of [A-Za-z0-9_.-], not '.' or '..'"
    elif kind == "snapshot_id":
        ok = is_valid_snapshot_id(value)  # type: ignore[arg-type]
        rule = "YYYYMMDD_HHMMSS_mmm"
    elif kind == "file":
        ok = isinstance(value, str) and value in SNAPSHOT_FILES
        rule = f"one of {sorted(SNAPSHOT_FILES)}"
    elif kind == "cluster_file":
        ok = isinstance(value, str) and value in CLUSTER_FILES
        rule = f"one of {sorted(CLUSTER_FILES)}"
    else:
        raise InvalidParams(f"unknown path part kind {kind!r}")
    if not ok:
        raise InvalidParams(f"invalid {kind} {value!r}: must be {rule}")
    return value  # type: ignore[return-value]
