"""The save path's pieces: parallel staging copies, the overlapped checksum, the writer thread."""
import os
import time
import zlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

from hpc.checkpoint import background_writer as background
from hpc.checkpoint import CheckpointStore
from hpc.checkpoint.checksums import verify
from hpc.checkpoint.files import ChecksumWriter, write_atomic
from hpc.checkpoint.staging import Staging, _split


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.booleans()), min_size=1, max_size=6),
       st.integers(1, 5))
def test_split_covers_every_byte_once_in_balanced_shares(specs, n):
    pairs = []
    for numel, strided in specs:
        src = torch.randn(numel, 2)[:, 0] if strided else torch.randn(numel)
        pairs.append((torch.full(src.shape, float("nan")), src))
    shares = _split(pairs, n)
    assert len(shares) == n
    for share in shares:
        for dst, src in share:
            dst.copy_(src)
    assert all(torch.equal(dst, src) for dst, src in pairs)
    total = sum(dst.nbytes for dst, _ in pairs)
    quota = max(1, -(-total // n))
    if all(not strided for _, strided in specs):  # cut anywhere: no share over its quota + one element
        assert all(sum(d.nbytes for d, _ in share) <= quota + 4 for share in shares)


def test_parallel_staging_copies_exactly_and_reuses_buffers():
    staging = Staging(threads=3)
    state = {"big": torch.randn(3_000_000), "odd": torch.randn(2000, 1000)[:, ::3],
             "small": [torch.arange(5), 7]}
    first = staging.stage(state, cpu_too=True)
    assert staging._pool is not None  # 12 MB and more: the parallel path ran
    for key in ("big", "odd"):
        assert torch.equal(first[key], state[key]) and first[key].data_ptr() != state[key].data_ptr()
    assert torch.equal(first["small"][0], state["small"][0]) and first["small"][1] == 7
    state["big"].add_(1)
    again = staging.stage(state, cpu_too=True)
    assert again["big"] is first["big"] and torch.equal(again["big"], state["big"])


class _ReusingWriter:
    """Stands for torch.save's zip writer: scribbles over its buffer once write() returns."""

    def __init__(self, out):
        self.out = out

    def write_all(self, chunks):
        for chunk in chunks:
            buf = bytearray(chunk)
            self.out.write(buf)
            buf[:] = b"\0" * len(buf)


def test_overlapped_checksum_matches_the_bytes_written(tmp_path):
    chunks = [os.urandom(n) for n in (10, 3 << 20, 100, (1 << 20) + 1, 5)]
    expected = zlib.crc32(b"".join(chunks))
    for overlap in (False, True):
        path = tmp_path / f"f{overlap}"
        with open(path, "wb") as f:
            out = ChecksumWriter(f, overlap=overlap)
            _ReusingWriter(out).write_all(chunks)
        assert out.info() == {"crc32": f"{expected:08x}", "bytes": sum(map(len, chunks))}
        assert path.read_bytes() == b"".join(chunks)


def test_overlapped_write_atomic_verifies(tmp_path):
    state = {"w": torch.randn(1_000_000), "b": torch.randn(10)}
    info = write_atomic(tmp_path / "a.pt", state, overlap=True)
    assert info == write_atomic(tmp_path / "b.pt", state, overlap=False)
    assert verify(tmp_path / "a.pt", info) == ""


def test_writer_thread_runs_jobs_in_order_and_reports_errors():
    writer, done = background.ThreadWriter(), []
    jobs = [background.start(done.append, (i,), "thread", writer) for i in range(5)]
    assert [j.wait() >= 0 for j in jobs] == [True] * 5 and done == list(range(5))

    def fail():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        background.start(fail, (), "thread", writer).wait()
    assert background.start(done.append, (9,), "thread", writer).wait() >= 0 and done[-1] == 9


def _left(writer):
    deadline = time.monotonic() + 5
    while writer._running and time.monotonic() < deadline:
        time.sleep(0.01)
    return not writer._running


def test_writer_thread_leaves_on_close_or_when_idle_and_comes_back(monkeypatch):
    writer, done = background.ThreadWriter(), []
    writer.submit(done.append, (1,))
    writer.close()  # after the queued job
    assert _left(writer) and done == [1]
    monkeypatch.setattr(background.ThreadWriter, "IDLE_S", 0.05)
    writer.submit(done.append, (2,)).wait()
    assert _left(writer)  # idle
    writer.submit(done.append, (3,)).wait()
    assert done == [1, 2, 3]


def test_rank_0_writes_do_not_block_other_stores_in_the_process(tmp_path):
    """Ranks simulated in one process: rank 0's background write waits for rank 1's file, which
    rank 1's own store writes on its own thread."""
    stores = [CheckpointStore(tmp_path, rank=r, world_size=2, mode="thread") for r in range(2)]
    for r in (0, 1):
        stores[r].save(3, {"model": torch.ones(2), "per_rank": {"rank": r}})
    for s in stores:
        s.wait()
    assert stores[0].latest() == 3 and stores[1].load()["per_rank"] == {"rank": 1}


def test_writer_thread_is_restarted_in_a_forked_child():
    writer = background.ThreadWriter()
    writer.submit(lambda: None, ()).wait()  # the parent's thread exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's writer thread did not survive the fork
        ok = False
        try:
            out = []
            writer.submit(out.append, (1,)).wait()
            ok = out == [1]
        finally:
            os.write(write, b"ok" if ok else b"no")
            os._exit(0)
    os.close(write)
    assert os.read(read, 2) == b"ok"
    os.waitpid(pid, 0)


def test_an_idle_writer_thread_keeps_no_failed_job_alive():
    import gc
    import weakref

    class Boom(Exception):
        pass

    def fail():
        raise Boom("disk on fire")

    writer = background.ThreadWriter()
    job = writer.submit(fail, ())
    with pytest.raises(Boom) as caught:
        job.wait()
    error = weakref.ref(caught.value)
    del job, caught
    deadline = time.monotonic() + 30  # the thread lets go right after the job; a wait only on a stalled machine
    while error() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    try:
        assert error() is None, "the idle writer thread still holds the failed job and its error"
    finally:
        writer.close()


@given(st.integers(min_value=0, max_value=10**6))
def test_every_name_given_to_a_ranks_file_is_read_back_as_that_ranks(rank):
    from hpc.checkpoint import layout
    from hpc.checkpoint.dcp_index import rank_metadata

    for name in (layout.rank_state(rank), layout.rank_report(rank), layout.rank_list(rank), rank_metadata(rank),
                 f"__{rank}_7.distcp"):
        assert layout.rank_of(name) == rank, name
    for shared in (layout.SHARED, layout.MARKER, layout.DCP_METADATA, f"rank-{rank}.pt.tmp", f"__{rank}_x.distcp"):
        assert layout.rank_of(shared) is None, shared
