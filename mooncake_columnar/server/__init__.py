"""`mooncake-columnar serve`: the upstream Mooncake master protocol over the engine (coro_rpc wire, handlers, HTTP metadata and metrics)."""
