"""Operator side: CLI, process launcher, demo, benchmarks and the evaluation harness."""
