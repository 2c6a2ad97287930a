"""The cluster's side of a push: a content-addressed store of code files, and trees made from it.

    python -m hpc.remote.store put STORE < stream       # run over ssh by hpc.remote.push

STORE/objects/<ab>/<cdef...> holds each file once by its digest (hpc.rundir.treecopy.digest; a
symlink is stored as a symlink), so a push sends only the files the cluster does not hold yet.
STORE/trees/<tree hash>/ is one pushed code tree, made from the objects by treecopy.make: written
in a temporary directory with its listing (LISTING) and renamed whole, so a tree that exists is
complete. An object is written to a temporary name, its digest checked, and renamed: a push cut
anywhere (the connection dropped, ssh killed) leaves objects that are whole or absent and no tree,
which is all a job would use, and the next push sends what is missing.

put's exchange, one ssh call: the laptop writes a header line (JSON: tree hash, files as
[path, digest, mode]); this side answers the digests it lacks (one JSON line); the laptop writes
those objects' bytes, one after another, as [digest, size] in the header said; this side answers the
tree's path. A failure is one line on stderr and exit status 3.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import uuid
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Sequence

from hpc.rundir import treecopy

LISTING = ".hpc-tree.json"
FAILED = 3


def object_path(store: Path, digest: str) -> Path:
    return store / "objects" / digest[:2] / digest[2:]


def tree_path(store: Path, tree: str) -> Path:
    return store / "trees" / tree


def existing_tree(store: Path, tree: str) -> Optional[str]:
    where = tree_path(store, tree)
    return str(where) if (where / LISTING).is_file() else None


def missing(store: Path, files: Sequence[Sequence[Any]]) -> List[str]:
    """The digests of `files` ([path, digest, mode]) that the store does not hold, each once."""
    return sorted({d for _, d, _ in files if not os.path.lexists(object_path(store, d))})


def read_exact(stream: IO[bytes], size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"the push stopped after {size - left} of {size} bytes of an object")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def put_object(store: Path, digest: str, data: bytes, mode: int) -> None:
    """Write one object under a temporary name, check its digest, rename it into place."""
    link = stat.S_ISLNK(mode)
    got = treecopy.digest(data, link=link)
    if got != digest:
        raise ValueError(f"object {digest[:12]} arrived as {got[:12]}")
    final = object_path(store, digest)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{treecopy.PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        if link:
            os.symlink(os.fsdecode(data), tmp)
        else:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        os.rename(tmp, final)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def make_tree(store: Path, tree: str, files: Sequence[Sequence[Any]]) -> str:
    """The tree from the store's objects, made whole or not at all (treecopy.make)."""
    def fill(tmp: Path) -> None:
        copied = treecopy.copy_files(tmp, {rel: (str(object_path(store, d)), mode) for rel, d, mode in files})
        wrong = [rel for rel, d, _ in files if copied[rel] != d]
        if wrong:
            raise ValueError(f"{wrong[0]} does not match its digest in the store")
        (tmp / LISTING).write_text(json.dumps({"tree": tree, "files": [list(f) for f in files]}))

    final, _, _ = treecopy.make(store / "trees", fill, tree)
    return str(final)


def put(store: Path, stdin: IO[bytes], stdout: IO[bytes]) -> str:
    header: Dict[str, Any] = json.loads(stdin.readline() or b"null")
    if not isinstance(header, dict):
        raise EOFError("the push stopped before its header")
    tree, files = header["tree"], header["files"]
    done = existing_tree(store, tree)
    lacking = [] if done else missing(store, files)
    stdout.write(json.dumps(lacking).encode() + b"\n")
    stdout.flush()
    if done:
        return done
    modes = {d: mode for _, d, mode in files}
    for digest in lacking:
        size = int(stdin.readline().strip() or -1)
        if size < 0:
            raise EOFError(f"the push stopped before object {digest[:12]}")
        put_object(store, digest, read_exact(stdin, size), modes[digest])
    return make_tree(store, tree, files)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "put":
        print("usage: python -m hpc.remote.store put STORE < stream", file=sys.stderr)
        return 2
    store = Path(argv[1]).expanduser()
    try:
        where = put(store, sys.stdin.buffer, sys.stdout.buffer)
    except (OSError, ValueError, EOFError, KeyError) as err:
        print(f"error: push into {store} failed: {err}; nothing a job would use was left. "
              "HINT: free space there if it is full, then submit again: only what is missing is sent.",
              file=sys.stderr)
        return FAILED
    sys.stdout.buffer.write(where.encode() + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
