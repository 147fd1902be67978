"""Benchmarks, runnable as modules: ``.venv/bin/python -m bench.<name>``."""
