"""Checksums of DCP's data files taken as they are written (hpc.checkpoint.shardcrc).

    python -m pytest -q tests/test_shardcrc.py
"""
from __future__ import annotations

import io
import zlib

import pytest
import torch

from hpc.checkpoint import checksums, shardcrc
from hpc.checkpoint.dcp_engine import DcpEngine
from hpc.checkpoint.shardcrc import own_shards


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture
def count_reads(monkeypatch):
    reads = []
    real = checksums._range_crc

    def counted(f, offset, length):
        reads.append((offset, length))
        return real(f, offset, length)
    monkeypatch.setattr(checksums, "_range_crc", counted)
    return reads


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "background"])
def test_a_commit_reads_no_data_back_and_records_what_a_read_back_gives(tmp_path, count_reads, blocking):
    model, opt = _model()
    with DcpEngine() as engine:
        engine.save(tmp_path, model, opt, blocking=blocking)
        engine.wait()
    info = own_shards(tmp_path, 0)
    assert info and count_reads == []  # every item's crc32 was taken as it was written
    for name, got in info.items():  # the same as reading the file back gives
        ranges = [(off, length) for off, length, _ in got["items"]]
        assert checksums.ranges_info(tmp_path / name, ranges) == got
    assert count_reads  # (the read-back above did read)


def test_a_file_written_elsewhere_is_read_back(tmp_path, count_reads):
    model, opt = _model()
    with DcpEngine() as engine:
        engine.save(tmp_path, model, opt, blocking=True)
    for f in tmp_path.glob("*.distcp"):
        shardcrc.written(f)  # as if another process (a forked writer) had written it
    info = own_shards(tmp_path, 0)
    assert info and count_reads


def _run(chunks: list[bytes], seek: bool = False) -> shardcrc.CrcStream:
    s = shardcrc.CrcStream(io.BytesIO())
    s.tell()
    for c in chunks:
        s.write(c)
        s.tell()
    if seek:
        s.seek(0)
    return s


def test_each_run_between_two_tells_gets_its_own_crc():
    s = _run([b"abc", b"", b"defgh"])
    assert s.valid and s.runs == {(0, 3): f"{zlib.crc32(b'abc'):08x}", (3, 5): f"{zlib.crc32(b'defgh'):08x}"}


def test_a_seek_or_a_short_write_makes_the_runs_untrusted():
    assert not _run([b"abc"], seek=True).valid

    class Short(io.BytesIO):
        def write(self, b):
            return super().write(bytes(b)[:1])
    s = shardcrc.CrcStream(Short())
    s.write(b"abc")
    assert not s.valid


def test_a_range_the_writer_did_not_see_as_one_run_is_read_back(tmp_path, count_reads):
    path = tmp_path / "f.distcp"
    path.write_bytes(b"0123456789")
    known = {(0, 4): f"{zlib.crc32(b'0123'):08x}"}
    info = checksums.ranges_info(path, [(0, 4), (4, 6)], known)
    assert count_reads == [(4, 6)]
    assert info == checksums.ranges_info(path, [(0, 4), (4, 6)])
