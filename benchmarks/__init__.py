"""Benchmarks: each prints its figures beside the named peer or the physical limit, measured in the same run.

Run one from the checkout's root as a module, e.g. `.venv/bin/python -m benchmarks.train_step --help`;
docs/benchmarks.md lists them and docs/results/ keeps their outputs.
"""
