"""Test support: the plain-Python reference model, servers for real-component tests, the builders
tests share, and the store contract suites (``oplog_store_contract``, ``snapshot_store_contract``)
that your own OpLogStore or object store can run."""
