from __future__ import annotations

from collections.abc import Iterator

import pytest

from mooncake_columnar.testing.s3_server import moto_s3


@pytest.fixture(scope="module")
def s3_uri() -> Iterator[str]:
    """A real S3 server (moto) for one test module: a URI of a fresh bucket on it."""
    with moto_s3() as uri:  # raises (test error, not skip) if moto cannot start
        yield uri
