"""Benchmark support: a deterministic corpus of agent conversations (``bench.corpus``)."""
