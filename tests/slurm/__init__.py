"""Tests that run on the real local SLURM cluster (see tests/conftest.py)."""
