"""Benchmarks: data sets (datasets.py), the paired-timing runner (runner.py, its loop measure.py), the result rows
(rows.py) and task scoring (scoring.py, execution.py)."""
