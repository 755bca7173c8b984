"""Benchmarks: data sets (datasets.py), the paired-timing runner (runner.py) and task scoring (scoring.py,
execution.py)."""
