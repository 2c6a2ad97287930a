"""DCP's pickled index read without running pickled code: only the types DCP's index is made of.

    index = load(open("step-8/.metadata", "rb"), "step-8/.metadata")   # DCP's Metadata
    # anything else in it: UnsafeCheckpoint, before any of it is called

torch.distributed.checkpoint pickles its index of a checkpoint (``.metadata``; after a save without
collectives each rank's ``__R.metadata`` too) and its own reader loads it with pickle.load: a
crafted index runs whatever its reduce names (os.system, ...) in whoever loads the checkpoint, an
evaluation job reading another user's run included, and the marker's checksums do not stop it (the
author of the file writes the marker too). Here an unpickler resolves only the globals such an
index holds: DCP's metadata classes, its storage records, torch's Size, dtypes and layouts,
paths and plain containers. Building those calls nothing that acts on the world.
"""

from __future__ import annotations

import inspect
import pickle
import sys
from typing import IO, Any

__all__ = ["UnsafeCheckpoint", "ADMITTED", "load", "refusal"]


class UnsafeCheckpoint(ValueError):
    """A checkpoint's file holds a pickled object that loading it would have to run or build."""


# module -> names it may give; "*": every class the module defines itself (DCP's metadata
# dataclasses, whatever a torch release adds to them). Globals an index made by DCP (torch 2.4 to
# 2.13) was seen to name, and constructors of the same harmless kind.
ADMITTED: dict[str, Any] = {
    "torch.distributed.checkpoint.metadata": "*",
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout from its name (torch.strided)
    "torch": {"Size"},  # and every torch.dtype (_admitted)
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "complex", "slice", "bytearray"},
}


def _admitted(module: str, name: str) -> bool:
    allowed = ADMITTED.get(module)
    if allowed is None or "." in name:  # a dotted name walks attributes: Metadata.__init__.__globals__
        return False
    if allowed == "*":
        found = vars(sys.modules.get(module) or __import__(module, fromlist=["_"])).get(name)
        return inspect.isclass(found) and found.__module__ == module
    if module == "torch" and name not in allowed:
        import torch

        return isinstance(vars(torch).get(name), torch.dtype)
    return name in allowed


def refusal(path: Any, what: str) -> str:
    return (f"{path} holds {what}, which a checkpoint's DCP index never holds: refused, loading never "
            "runs pickled code. HINT: delete this checkpoint or read another one; if a newer torch "
            "wrote this type into its index, add it to hpc.checkpoint.dcp_pickle.ADMITTED")


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], path: Any) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if not _admitted(module, name):
            raise UnsafeCheckpoint(refusal(self.path, f"{module}.{name}"))
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpoint(refusal(self.path, "a persistent reference"))


def load(file: IO[bytes], path: Any) -> Any:
    """Unpickle DCP's index from `file` (read from `path`, named in errors)."""
    try:
        return _Unpickler(file, path).load()
    except UnsafeCheckpoint:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError) as err:
        raise UnsafeCheckpoint(f"{path} is not a DCP index ({type(err).__name__}: {err}). HINT: delete "
                               "this checkpoint or read another one") from None
