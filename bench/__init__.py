"""Benchmarks of the gateway (see docs/benchmarks.md); run from the repository root."""
