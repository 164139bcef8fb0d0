"""asv benchmarks of mooncake-columnar: one module per area (see ARCHITECTURE.md section 7)."""
