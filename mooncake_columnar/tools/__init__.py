"""Tools around the engine, not part of it: the `mooncake-columnar` command line (cli.py and the
snapshot, simulate and verify subcommands), benchmarks (bench*.py), the failover demo, seeded
synthetic workloads (synthetic.py, shared by all of them) and the recovery-window analysis."""
