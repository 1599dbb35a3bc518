"""Benchmarks: `eagle-batch bench NAME [--json]` prints one JSON object (numbers go in docs/explanation/performance.md)."""
