"""asv benchmarks for gqa (see asv.conf.json at the repository root)."""
