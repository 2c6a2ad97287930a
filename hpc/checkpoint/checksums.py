"""A checkpoint file's checksum: its crc32 and size against what the marker or a rank's list says.

    python -c "from pathlib import Path; from hpc.checkpoint.checksums import file_info, verify; p = Path('/etc/hostname'); print(repr(verify(p, file_info(p))))"

Every check returns '' for an intact file, else what is wrong in words (missing, truncated,
corrupted, unreadable), never raises: what is read from disk is untrusted. Checked files are read
in chunks into one reused buffer, never whole into memory; a DCP shard file is checked per stored
tensor (ranges_info), so a reader of some of its tensors reads only those bytes. Markers written
before the crc32 format hold a sha256 hex string per file; verify() still accepts them.
Imports no torch: the files are checked as bytes, whatever wrote them (hpc.checkpoint.files).
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path
from typing import Any

CHUNK = 8 * 2**20  # read size while verifying: large enough for full-speed reads, small in memory


def verify(path: Path, expected: Any) -> str:
    """'' when `path` matches `expected` (write_atomic's info, or a legacy sha256 hex string),
    else what is wrong. Reads in chunks into one reused buffer: never the whole file in memory."""
    legacy = isinstance(expected, str)
    if not legacy and isinstance(expected.get("items"), list):
        return verify_ranges(path, expected, [(off, length) for off, length, _ in expected["items"]])
    digest = hashlib.sha256() if legacy else None
    crc, size, buf = 0, 0, bytearray(CHUNK)
    try:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                view = memoryview(buf)[:n]
                digest.update(view) if legacy else None
                crc = crc if legacy else zlib.crc32(view, crc)
                size += n
    except OSError as err:
        return _unreadable(path, err)
    if legacy:
        return "" if digest.hexdigest() == expected else \
            f"{path.name} does not match its sha256 checksum (corrupted)"
    return _compared(path.name, size, crc, expected)


def matches(name: str, data: bytes, expected: dict[str, Any]) -> str:
    """verify() on the bytes already read of the file `name` (a small file read whole to be used:
    an index, a rank's file list): checked as read, never read twice."""
    return _compared(name, len(data), zlib.crc32(data), expected)


def read_checked(path: Path, expected: dict[str, Any]) -> tuple[bytes, str]:
    """(the bytes of the small file `path`, '' or what is wrong with them against `expected`)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        return b"", _unreadable(path, err)
    return data, matches(path.name, data, expected)


def checksum_info(info: Any) -> bool:
    """Whether `info` has the form of write_atomic's checksum info ({"crc32": str, "bytes": int})."""
    return isinstance(info, dict) and isinstance(info.get("bytes"), int) and isinstance(info.get("crc32"), str)


def _compared(name: str, size: int, crc: int, expected: dict[str, Any]) -> str:
    if size != expected.get("bytes"):
        return f"{name} has {size} bytes, the marker says {expected.get('bytes')} (truncated)"
    if f"{crc:08x}" != expected.get("crc32"):
        return f"{name} does not match its crc32 checksum (corrupted)"
    return ""


def _unreadable(path: Path, err: OSError) -> str:
    if isinstance(err, FileNotFoundError):
        return f"{path.name} is missing"
    if isinstance(err, IsADirectoryError):
        return f"{path.name} is a directory, not a file"
    return f"{path.name} is unreadable ({err.strerror})"


def file_info(path: Path) -> dict[str, Any]:
    """write_atomic's info ({"crc32", "bytes"}) of a file another writer made (DCP's metadata)."""
    crc, size, buf = 0, 0, bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(memoryview(buf)[:n], crc)
            size += n
    return {"crc32": f"{crc:08x}", "bytes": size}


def ranges_info(path: Path, ranges: list[tuple[int, int]], known: dict | None = None) -> dict[str, Any]:
    """Info of a file read in pieces (a DCP shard file): a crc32 per (offset, length) range, so
    that a reader of some of its tensors verifies exactly the bytes it reads, not the whole file.
    "items" lists [offset, length, crc32]; "crc32" is that of the items' text. `known`: crc32s
    taken as the file was written, {(offset, length): crc32} (hpc.checkpoint.shardcrc); a range
    it lacks is read back."""
    wanted = sorted(set(ranges))
    crcs = dict(known or {})
    missing = [r for r in wanted if r not in crcs]
    if missing:  # the file is opened only for ranges not checksummed as written
        with open(path, "rb", buffering=0) as f:
            crcs.update({(off, length): f"{_range_crc(f, off, length):08x}" for off, length in missing})
    items = [[off, length, crcs[(off, length)]] for off, length in wanted]
    text = json.dumps(items)
    return {"crc32": f"{zlib.crc32(text.encode()):08x}", "bytes": os.stat(path).st_size, "items": items}


def _range_crc(f: Any, offset: int, length: int) -> int:
    crc, left = 0, length
    f.seek(offset)
    while left > 0:
        data = f.read(min(left, CHUNK))
        if not data:
            break
        crc, left = zlib.crc32(data, crc), left - len(data)
    return crc


def verify_ranges(path: Path, info: dict[str, Any], ranges: list[tuple[int, int]]) -> str:
    """'' when the (offset, length) `ranges` of `path` match ranges_info's `info`, else what is
    wrong; reads those ranges only. An info without items (any other file): the whole file."""
    items = info.get("items") if isinstance(info, dict) else None
    if not isinstance(items, list):
        return verify(path, info)
    known = {(off, length): crc for off, length, crc in items}
    try:
        if os.stat(path).st_size != info.get("bytes"):
            return f"{path.name} has {os.stat(path).st_size} bytes, the marker says {info.get('bytes')} (truncated)"
        with open(path, "rb", buffering=0) as f:
            for off, length in sorted(set(ranges)):
                if known.get((off, length)) != f"{_range_crc(f, off, length):08x}":
                    return f"{path.name} does not match its crc32 checksum at offset {off} (corrupted)"
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as err:
        return f"{path.name} is unreadable ({err.strerror})"
    return ""
