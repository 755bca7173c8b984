"""Analyses of multi-job studies over the report table (python -m specnoise.studies.<name> DIR)."""
