"""`mooncake-columnar serve`: upstream Mooncake master protocol over the engine (coro_rpc wire,
handlers, HTTP metadata server, metrics)."""
