"""Cluster profiles: python -m hpc.submit PIPELINE --profile NAME reads profiles/NAME.yaml."""
