"""Benchmarks: `eagle-batch bench NAME [--json]` prints one JSON object (numbers go in benchmarks/results.tsv)."""
