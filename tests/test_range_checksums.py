"""Checksums per stored tensor: a reader verifies exactly the bytes it reads (hpc.checkpoint.checksums).

    python -m pytest -q tests/test_range_checksums.py
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hpc.checkpoint.checksums import ranges_info, verify, verify_ranges
from hpc.checkpoint.layout import check


def _file(tmp_path, data: bytes):
    path = tmp_path / "__1_0.distcp"
    path.write_bytes(data)
    return path


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=2, max_size=6), hit=st.integers(0, 10**6))
def test_a_corrupt_byte_is_found_by_the_reader_of_its_range_only(tmp_path_factory, sizes, hit):
    tmp_path = tmp_path_factory.mktemp("r")
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    ranges = list(zip(offsets, sizes))
    path = _file(tmp_path, bytes(range(256)) * (sum(sizes) // 256 + 1))
    info = ranges_info(path, ranges)
    assert verify(path, info) == ""
    data = bytearray(path.read_bytes())
    bad = hit % sum(sizes)
    data[bad] ^= 0xFF
    path.write_bytes(bytes(data))
    for off, length in ranges:
        problem = verify_ranges(path, info, [(off, length)])
        assert bool(problem) == (off <= bad < off + length), (off, length, bad)
    assert "corrupted" in verify(path, info)


def test_a_truncated_shard_fails_without_reading_it(tmp_path):
    path = _file(tmp_path, b"x" * 100)
    info = ranges_info(path, [(0, 60), (60, 40)])
    path.write_bytes(b"x" * 99)
    assert "truncated" in verify_ranges(path, info, [(0, 60)])


def test_a_marker_is_trusted_for_sizes_when_no_checksum_is_asked(tmp_path):
    import json

    (tmp_path / "shared.pt").write_bytes(b"abc")
    marker = {"step": 1, "files": {"shared.pt": {"crc32": "00000000", "bytes": 3}}}
    (tmp_path / "COMPLETE.json").write_text(json.dumps(marker))
    assert check(tmp_path, crc=())[0] == ""  # the wrong checksum is not looked at
    assert "corrupted" in check(tmp_path)[0]
    (tmp_path / "shared.pt").write_bytes(b"ab")
    assert "truncated" in check(tmp_path, crc=())[0]
