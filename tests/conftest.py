"""Shared fixtures. `slurm_cluster` brings one real local SLURM cluster up for the whole session.

    python -m pytest                      # unit tests and, where SLURM is installed, cluster tests
    HPC_TEST_CLUSTER_DIR=/tmp/c pytest    # keep the cluster's files (and logs) in /tmp/c

Tests that need the cluster carry `@pytest.mark.slurm`. Outside CI they are skipped, with the reason,
when the SLURM programs are missing; in CI (CI=true) a missing SLURM fails them instead, so they
can never be skipped silently there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from hpc.cluster import LocalCluster
from hpc.cluster.local import missing_binaries

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_collection_modifyitems(config, items):
    missing = missing_binaries()
    if not missing or IN_CI:
        return
    skip = pytest.mark.skip(reason=f"SLURM not installed here (missing {', '.join(missing)}); "
                                   "run `python -m hpc.cluster install` to run these tests")
    for item in items:
        if "slurm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = missing_binaries()
    if missing:
        pytest.fail(f"SLURM programs missing: {', '.join(missing)}. HINT: python -m hpc.cluster install")
    directory = os.environ.get("HPC_TEST_CLUSTER_DIR") or tempfile.mkdtemp(prefix="hpc-test-cluster-")
    cluster = LocalCluster(directory)
    # A cluster already running in HPC_TEST_CLUSTER_DIR belongs to whoever started it: reuse, leave up.
    owned = not cluster.is_up()
    cluster.up(log=lambda msg: None)
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env())
    try:
        yield cluster
    finally:
        if owned:
            cluster.down(log=lambda msg: None)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A directory job processes on the cluster can write to (they run on this host as this user)."""
    d = tmp_path / "jobs"
    d.mkdir()
    return d
