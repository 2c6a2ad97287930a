"""Named clusters: the file's parsing (pure), unknown names refused with the closest, and the
commands refusing them in one line.

    python -m pytest tests/test_remote_clusters.py
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import hpc
from hpc.config.checks import ConfigError
from hpc.remote import clusters

ROOT = Path(__file__).resolve().parents[1]
GOOD = """
jean-zay:
  ssh: alice@jean-zay.idris.fr
  port: 2222
  identity: ~/.ssh/id_ed25519
  jump: bastion.example.org
  options: {ServerAliveInterval: 10}
  python: /home/alice/venv/bin/python
  setup: module load pytorch
  runs: /scratch/alice/hpc-runs
  profile: gpu8
  partition: gpu
  account: proj42
  qos: normal
laptop:
  ssh: local
"""


def test_a_full_entry_and_a_local_one_are_read_as_written():
    found = clusters.parse(GOOD)
    jz = found["jean-zay"]
    assert (jz.ssh, jz.port, jz.identity, jz.jump) == ("alice@jean-zay.idris.fr", 2222, "~/.ssh/id_ed25519",
                                                       "bastion.example.org")
    assert jz.options == (("ServerAliveInterval", "10"),)
    assert (jz.python, jz.setup, jz.runs, jz.profile) == ("/home/alice/venv/bin/python", "module load pytorch",
                                                          "/scratch/alice/hpc-runs", "gpu8")
    assert jz.defaults() == {"partition": "gpu", "account": "proj42", "qos": "normal"}
    assert found["laptop"].ssh is None and found["laptop"].python == "python3"


@pytest.mark.parametrize("text, words", [
    ("a: [1, 2]", "cluster 'a' is a list"),
    ("a: {port: 22}", "has no ssh key"),
    ("a: {ssh: 'x y'}", "ssh='x y'"),
    ("a: {ssh: h, port: 70000}", "port=70000"),
    ("a: {ssh: h, port: yes}", "port=True"),
    ("a: {ssh: h, partiton: gpu}", "did you mean partition?"),
    ("a: {ssh: h, options: {'-oProxyCommand': x}}", "ssh option '-oProxyCommand'"),
    ("slurm: {ssh: h}", "hpc's own kinds"),
    ("- a\n- b", "a list at the top"),
    ("a: {ssh: h\n", "line"),
])
def test_a_bad_entry_is_one_line_naming_the_file_the_entry_and_the_fix(text, words):
    with pytest.raises(ConfigError) as err:
        clusters.parse(text, "/home/u/.config/hpc/clusters.yaml")
    message = str(err.value)
    assert words in message and "clusters.yaml" in message and "HINT:" in message and "\n" not in message


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                              lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids,
                                                                                        max_size=4),
                              max_leaves=12).map(lambda data: yaml.safe_dump(data))))
def test_garbage_is_parsed_or_refused_with_a_config_error_never_anything_else(text):
    try:
        found = clusters.parse(text)
    except ConfigError as err:
        assert "HINT:" in str(err) and "\n" not in str(err)
        return
    assert all(isinstance(c, clusters.Cluster) and c.name == name for name, c in found.items())


def test_the_file_is_found_by_its_environment_variable_or_under_the_user_config(tmp_path):
    assert clusters.path({"HPC_CLUSTERS_FILE": "/x/c.yaml"}) == Path("/x/c.yaml")
    assert clusters.path({"XDG_CONFIG_HOME": "/cfg"}) == Path("/cfg/hpc/clusters.yaml")
    assert clusters.load({"HPC_CLUSTERS_FILE": str(tmp_path / "none.yaml")}) == {}


def test_an_unknown_name_is_refused_with_the_closest_names():
    known = clusters.parse(GOOD)
    with pytest.raises(ConfigError, match=r"unknown cluster 'jean-zai'.*HINT: did you mean jean-zay\?"):
        clusters.find("jean-zai", known)


def test_submit_refuses_an_unknown_cluster_in_one_line_before_connecting(tmp_path, monkeypatch):
    (tmp_path / "clusters.yaml").write_text(GOOD)
    monkeypatch.setenv("HPC_CLUSTERS_FILE", str(tmp_path / "clusters.yaml"))
    out = subprocess.run([sys.executable, "-m", "hpc.submit", "tests.tiny_pipeline", "--cluster", "jeanzay"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    line, = out.stderr.strip().splitlines()
    assert "unknown cluster 'jeanzay'" in line and "did you mean jean-zay" in line
    with pytest.raises(ConfigError, match="did you mean jean-zay"):
        hpc.submit("tests.tiny_pipeline", cluster="jeanzay")


def test_status_of_an_unknown_cluster_address_names_the_closest(tmp_path, monkeypatch):
    (tmp_path / "clusters.yaml").write_text(GOOD)
    monkeypatch.setenv("HPC_CLUSTERS_FILE", str(tmp_path / "clusters.yaml"))
    out = subprocess.run([sys.executable, "-m", "hpc.status", "laptopp:/runs/x"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "did you mean laptop" in out.stderr, out.stderr


def test_a_damaged_file_is_one_line_for_status_with_no_argument(tmp_path, monkeypatch):
    (tmp_path / "clusters.yaml").write_text("here: {ssh: local}\n")
    monkeypatch.setenv("HPC_CLUSTERS_FILE", str(tmp_path / "clusters.yaml"))
    out = subprocess.run([sys.executable, "-m", "hpc.status"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "hpc's own kinds" in out.stderr, out.stderr
