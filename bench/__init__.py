"""Benchmarks, each a module run from the repository root: `python -m bench.heartbeat` (all of them: `make bench`)."""
