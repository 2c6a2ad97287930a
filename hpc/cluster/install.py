"""Install the Debian packages a local cluster needs.

    python -m hpc.cluster install
"""

from __future__ import annotations

import os
import subprocess

from hpc.cluster.daemons import ClusterError
from hpc.cluster.daemonset import missing_binaries

# bubblewrap: the container-free stand-in for Pyxis and Apptainer in the SLURM tests (runtime exec);
# openssh-server: the login node the tests of named clusters reach over ssh (tests/sshd.py)
PACKAGES = ["slurm-wlm", "slurmdbd", "mariadb-server", "mariadb-client", "munge", "bubblewrap", "openssh-server"]
SSHD = "/usr/sbin/sshd"


def install_packages(log=print) -> None:
    if not missing_binaries() and os.path.exists(SSHD):
        log("SLURM, slurmdbd, MariaDB, munge and sshd are already installed")
        return
    if os.geteuid() != 0:
        raise ClusterError("installing packages needs root. HINT: sudo apt-get install -y " + " ".join(PACKAGES))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log("apt-get update")
    _apt(["apt-get", "update", "-q"], env)
    log("apt-get install " + " ".join(PACKAGES))
    _apt(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], env)
    still = missing_binaries() + ([] if os.path.exists(SSHD) else [SSHD])
    if still:
        raise ClusterError(f"still missing after install: {', '.join(still)}")


def _apt(argv: list[str], env: dict[str, str]) -> None:
    out = subprocess.run(argv, env=env, capture_output=True, text=True)
    if out.returncode:
        raise ClusterError(f"`{' '.join(argv)}` failed:\n{out.stderr[-3000:]}")
