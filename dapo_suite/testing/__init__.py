"""Doubles the tests and the benchmarks share: servers that inject faults or latency, never a stand-in for a
model."""
