"""Pure checks of the local cluster's layout and generated configuration."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc.cluster import files
from hpc.cluster import layout as L

GOLDEN = Path(__file__).parent / "golden"


def fixed_layout(**kw) -> L.ClusterLayout:
    base = dict(dir="/srv/hpc-cluster", name="hpctest", hostname="host1", port_base=20000)
    base.update(kw)
    return L.ClusterLayout(**base)


def test_slurm_conf_matches_golden():
    assert files.render_slurm_conf(fixed_layout()) == (GOLDEN / "slurm.conf").read_text()


def test_gres_conf_matches_golden():
    assert files.render_gres_conf(fixed_layout()) == (GOLDEN / "gres.conf").read_text()


def test_two_directories_get_disjoint_port_blocks():
    a = L.ClusterLayout.create("/tmp/cluster-a")
    b = L.ClusterLayout.create("/tmp/cluster-b")
    assert a.name != b.name
    assert not set(a.all_ports()) & set(b.all_ports())
    assert all(L.PORT_RANGE[0] <= p < L.PORT_RANGE[1] + L.PORT_BLOCK for p in a.all_ports())


def test_ports_are_distinct_within_a_cluster():
    c = fixed_layout(nodes=5)
    assert len(set(c.all_ports())) == 3 + 5
    assert max(c.all_ports()) < c.port_base + L.PORT_BLOCK


def test_node_names_and_nodelist():
    assert fixed_layout(nodes=3).node_names == ["n1", "n2", "n3"]
    assert fixed_layout(nodes=3).nodelist == "n[1-3]"
    assert fixed_layout(nodes=1).nodelist == "n1"


def test_no_gpus_means_no_gres():
    c = fixed_layout(gpus_per_node=0)
    assert "Gres=" not in files.render_slurm_conf(c)
    assert files.fake_gpu_paths(c) == []


@pytest.mark.parametrize("kw", [dict(nodes=0), dict(nodes=L.MAX_NODES + 1), dict(gpus_per_node=-1),
                                dict(cpus_per_node=0)])
def test_bad_sizes_are_refused_with_a_hint(kw):
    with pytest.raises(ValueError, match="HINT"):
        L.ClusterLayout.create("/tmp/x", **kw)


def test_layout_round_trips_through_its_state_file(tmp_path):
    c = L.ClusterLayout.create(tmp_path, nodes=3, gpus_per_node=2)
    c.save()
    assert L.ClusterLayout.load(tmp_path) == c


def test_configless_without_accounting_matches_golden():
    c = fixed_layout(configless=True, accounting=False, min_job_age_s=10)
    assert files.render_slurm_conf(c) == (GOLDEN / "slurm-configless-no-accounting.conf").read_text()


def test_a_configless_sites_shell_has_a_conf_server_and_no_slurm_conf():
    c = fixed_layout(configless=True)
    assert c.env() == {"SLURM_CONF_SERVER": "127.0.0.1:20000"}
    # before any config is fetched, libmunge knows only its default socket
    assert c.munge_socket == L.DEFAULT_MUNGE_SOCKET
    assert fixed_layout().env() == {"SLURM_CONF": "/srv/hpc-cluster/etc/slurm.conf"}


def test_accounting_is_one_switch():
    conf = files.render_slurm_conf(fixed_layout(accounting=False))
    assert "AccountingStorageType=accounting_storage/none" in conf and "slurmdbd" not in conf
    assert "enable_configless" not in conf


def test_variants_round_trip_and_a_too_short_min_job_age_is_refused(tmp_path):
    c = L.ClusterLayout.create(tmp_path, configless=True, accounting=False, min_job_age_s=5)
    c.save()
    assert L.ClusterLayout.load(tmp_path) == c
    with pytest.raises(ValueError, match="HINT"):
        L.ClusterLayout.create(tmp_path, min_job_age_s=1)


def test_max_array_size_is_rendered_and_checked():
    assert "\nMaxArraySize=4\n" in files.render_slurm_conf(fixed_layout(max_array_size=4))
    assert "\nMaxJobCount=100000\n" in files.render_slurm_conf(fixed_layout())  # 10,000 held tasks fit
    with pytest.raises(ValueError, match="--max-array-size 0: expected 1 to 4000001.*HINT"):
        L.ClusterLayout.create("/tmp/cluster-a", max_array_size=0)


def test_first_job_id_comes_from_the_port_block_unless_given(tmp_path):
    assert "FirstJobId" not in files.render_slurm_conf(fixed_layout(port_base=L.PORT_RANGE[0]))  # block 0: SLURM's 1
    assert fixed_layout(port_base=L.PORT_RANGE[0] + 3 * L.PORT_BLOCK).job_id_start == 1 + 3 * L.JOB_ID_STRIDE
    assert "\nFirstJobId=3001\n" in files.render_slurm_conf(fixed_layout(first_job_id=3001))
    c = L.ClusterLayout.create(tmp_path, first_job_id=3001)
    c.save()
    assert L.ClusterLayout.load(tmp_path).first_job_id == 3001
    with pytest.raises(ValueError, match="first job id 0: expected 1 to .*HINT"):
        L.ClusterLayout.create(tmp_path, first_job_id=0)


@given(st.integers(0, L.PORT_BLOCKS - 1), st.integers(0, L.PORT_BLOCKS - 1), st.integers(0, 37), st.integers(0, 37))
def test_the_first_jobs_of_two_clusters_never_share_a_master_port(a, b, n, m):
    """Two sandbox clusters on one host (two test workers, a user's two): a DDP job's MASTER_PORT
    comes from its job id, so each block's first 38 jobs must land on ports of their own."""
    from hpc.runtime.distenv import master_port_for

    if a == b:
        return
    first = [fixed_layout(port_base=L.PORT_RANGE[0] + k * L.PORT_BLOCK).job_id_start for k in (a, b)]
    assert all(1 <= f <= L.MAX_JOB_ID for f in first)
    assert master_port_for(str(first[0] + n)) != master_port_for(str(first[1] + m))


@given(st.integers(min_value=-10**6, max_value=10**6))
def test_a_port_base_is_taken_only_with_its_whole_block_in_range(base):
    fits = 1024 <= base and base + L.PORT_BLOCK - 1 <= 65535
    if fits:
        assert max(L.ClusterLayout.create("/tmp/cluster-a", port_base=base).all_ports()) <= 65535
    else:
        with pytest.raises(ValueError, match=rf"--port-base {base}: expected 1024 to .*HINT"):
            L.ClusterLayout.create("/tmp/cluster-a", port_base=base)


@given(st.integers(1, 180), st.integers(1, 8))
def test_every_step_socket_path_fits_however_deep_the_cluster_directory(depth, nodes):
    """slurmd's per-step socket, <spool>/<node>/<node>_<job id>.<step id>, must stay within a Unix
    socket path's 107 bytes: a deep directory (a test worker's tmp path) moves the spool to /tmp."""
    c = fixed_layout(dir="/" + "d" * depth, nodes=nodes, port_base=L.PORT_RANGE[1] - L.PORT_BLOCK)
    node = c.node_names[-1]
    socket = f"{c.spool}/{node}/{node}_{(L.PORT_BLOCKS - 1) * L.JOB_ID_STRIDE + 99999}.4294967291"
    assert len(socket) <= L.SOCKET_PATH_MAX
    assert c.spool == Path(c.dir, "spool") or len(f"{c.dir}/spool/{node}/{node}_1.4294967291") > 90
    assert fixed_layout(dir="/srv/c").spool == Path("/srv/c/spool")
    assert f"SlurmdSpoolDir={c.spool}/%n" in files.render_slurm_conf(c)
