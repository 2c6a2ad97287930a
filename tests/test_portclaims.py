"""Port blocks claimed by `hpc.cluster up`s starting at the same moment (hpc.cluster.portclaims).

    python -m pytest -q tests/test_portclaims.py
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hpc.cluster import LocalCluster
from hpc.cluster.daemons import ClusterError
from hpc.cluster.layout import PORT_BLOCK, default_port_base
from hpc.cluster.portclaims import free_port_block
from hpc.cluster.portclaims import ENV_DIR, PortClaims

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def claims_dir(tmp_path, monkeypatch):
    where = tmp_path / "claims"
    where.mkdir()
    monkeypatch.setenv(ENV_DIR, str(where))
    return where


def _live_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _claim_as(pid: int, base: int, directory: str, where) -> None:
    """Write a claim as process `pid` made it (the table is plain JSON under the lock)."""
    with PortClaims(where).locked():
        pass  # creates the files
    (where / "hpc-cluster-port-claims.json").write_text(json.dumps({str(base): {"dir": directory, "pid": pid}}))


def test_a_claim_counts_while_its_up_lives_and_only_for_other_directories(claims_dir, tmp_path):
    other = _live_process()
    try:
        _claim_as(other.pid, 10000, "/elsewhere", claims_dir)
        with PortClaims().locked() as table:
            assert table.taken_by_other(10000, "/here")
            assert not table.taken_by_other(10000, "/elsewhere")  # its own claim
            assert not table.taken_by_other(10032, "/here")
    finally:
        other.stdin.close()
        other.wait()
    with PortClaims().locked() as table:  # its up has died: the claim is ignored, then dropped
        assert not table.taken_by_other(10000, "/here")
    assert json.loads((claims_dir / "hpc-cluster-port-claims.json").read_text()) == {}


def test_a_torn_or_foreign_table_is_read_as_no_claims(claims_dir):
    with PortClaims().locked():
        pass
    for garbage in ("{", "[1, 2]", '{"10000": {"dir": "/x", "pid": "zero"}}', '{"10000": 7}'):
        (claims_dir / "hpc-cluster-port-claims.json").write_text(garbage)
        with PortClaims().locked() as table:
            assert table.claims == {}


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(table=st.dictionaries(st.text(), JSON | st.fixed_dictionaries({"dir": st.text(), "pid": JSON})) | JSON)
def test_any_table_on_disk_is_read_without_error(tmp_path_factory, table):
    """Whatever another program (or a torn write) left in the table, a claim is made and checked."""
    where = tmp_path_factory.mktemp("claims")
    (where / "hpc-cluster-port-claims.json").write_text(json.dumps(table))
    with PortClaims(where).locked() as claims:
        assert claims.taken_by_other(10000, "/here") in (True, False)
        claims.claim(10000, "/here")
    with PortClaims(where).locked() as claims:
        assert not claims.taken_by_other(10000, "/here") and claims.taken_by_other(10000, "/elsewhere")


RACER = textwrap.dedent("""
    import sys
    from hpc.cluster.portclaims import free_port_block
    from hpc.cluster.portclaims import PortClaims
    start, directory = int(sys.argv[1]), sys.argv[2]
    sys.stdin.readline()  # every racer started: go at once
    with PortClaims().locked() as table:
        base = free_port_block(start, lambda b: table.taken_by_other(b, directory))
        table.claim(base, directory)
    print(base, flush=True)
    sys.stdin.read()  # an up still starting its daemons: alive until the test ends it
""")


def test_ups_starting_together_from_the_same_block_claim_different_blocks(claims_dir, tmp_path):
    """Six `up`s at once, all starting their search at the same block: each gets its own."""
    start = free_port_block(default_port_base(str(tmp_path)))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), ENV_DIR: str(claims_dir)}
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(start), str(tmp_path / f"c{i}")], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(6)]
    try:
        for r in racers:
            r.stdin.write("go\n")
        for r in racers:
            r.stdin.flush()
        bases = [int(r.stdout.readline()) for r in racers]
    finally:
        for r in racers:
            r.stdin.close()
            r.wait()
    assert len(set(bases)) == 6, bases
    assert all(b % PORT_BLOCK == start % PORT_BLOCK for b in bases)


def test_a_cluster_moves_off_a_block_another_up_claimed_and_a_named_one_is_refused(claims_dir, tmp_path):
    directory = tmp_path / "c"
    default = free_port_block(default_port_base(str(directory)))
    other = _live_process()
    try:
        _claim_as(other.pid, default, str(tmp_path / "other"), claims_dir)
        said = []
        cluster = LocalCluster(directory, nodes=1, gpus_per_node=0, port_base=default)
        with pytest.raises(ClusterError, match=r"claimed by another `hpc.cluster up` starting now.*HINT: .*--port-base"):
            cluster._choose_ports(cluster._daemons(), said.append)
        cluster = LocalCluster(directory, nodes=1, gpus_per_node=0)
        cluster.layout = dataclasses.replace(cluster.layout, port_base=default)  # whatever its own default
        cluster._choose_ports(cluster._daemons(), said.append)
        assert cluster.layout.port_base != default
        assert said == [f"ports {default}..{default + PORT_BLOCK - 1} are claimed by another `hpc.cluster up` "
                        f"starting now: this cluster takes ports {cluster.layout.port_base}.."
                        f"{cluster.layout.port_base + PORT_BLOCK - 1} instead"]
        with PortClaims().locked() as table:  # claimed for this directory until its up releases it
            assert table.taken_by_other(cluster.layout.port_base, tmp_path / "other")
        PortClaims().release(directory)
        with PortClaims().locked() as table:
            assert not table.taken_by_other(cluster.layout.port_base, tmp_path / "other")
    finally:
        other.stdin.close()
        other.wait()
