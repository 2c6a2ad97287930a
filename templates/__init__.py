"""Pipeline templates and cluster profiles (YAML), shipped as package data of hpc.templates.

Read through importlib.resources (hpc.config.schema), so a wheel or `pip install .` finds them too.
"""
