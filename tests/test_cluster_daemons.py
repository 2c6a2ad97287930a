"""The checks the local cluster makes before starting a daemon."""

import socket

from hpc.cluster.daemons import unix_socket_live


def test_a_socket_with_a_listener_is_live_and_a_leftover_file_is_not(tmp_path):
    # The leftover of a killed munged is a socket file nobody listens on: a configless cluster
    # removes it and starts its own munged, but uses one that answers.
    path = tmp_path / "munge.socket.2"
    assert not unix_socket_live(path)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        assert unix_socket_live(path)
    assert path.exists() and not unix_socket_live(path)
