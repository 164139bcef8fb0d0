"""Interned string dictionaries: tenant, client, group, segment names -> small integer codes."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import NameLimitExceeded


class StringDictionary:
    """Append-only str <-> code mapping (the number of distinct strings is small). ``limit``:
    the most names it holds (its code column's range); ``what`` names it in the error."""

    def __init__(self, what: str = "names", limit: int = 2**31 - 1) -> None:
        self._codes: dict[str, int] = {}
        self._names: list[str] = []
        self.what, self.limit = what, limit
        # ``lookup(name, -1)``: :meth:`find` without its Python frame (the dict's own ``get``;
        # the single-key reads call it on every get)
        self.lookup = self._codes.get

    def __len__(self) -> int:
        return len(self._names)

    def code(self, name: str) -> int:
        """The code of ``name``, interning it on first use (NameLimitExceeded when full)."""
        c = self._codes.get(name)
        if c is None:
            c = len(self._names)
            if c >= self.limit:
                raise NameLimitExceeded(self.what, name, self.limit)
            self._codes[name] = c
            self._names.append(name)
        return c

    def codes(self, codes: np.ndarray, names: list[str]) -> np.ndarray:
        """The codes of the names ``names[codes]`` (interning new ones, all or none): a lookup
        table over the few distinct names, gathered; ``codes`` itself when the two agree."""
        new = [v for v in dict.fromkeys(names) if v not in self._codes]
        if new and len(self._names) + len(new) > self.limit:
            raise NameLimitExceeded(self.what, new[self.limit - len(self._names)], self.limit)
        lut = np.array([self.code(v) for v in names], np.int32)
        return codes if np.array_equal(lut, np.arange(lut.size)) else lut[codes]

    def find(self, name: str) -> int:
        """The code of ``name`` or -1 if it was never interned."""
        return self._codes.get(name, -1)

    def name(self, code: int) -> str:
        return self._names[code]

    def decode(self, codes: np.ndarray) -> pa.Array:
        """Codes -> a string array (-1 decodes to "")."""
        names = pa.array(self._names + [""], pa.string())
        idx = np.where(codes < 0, len(self._names), codes).astype(np.int32)
        return names.take(pa.array(idx))
