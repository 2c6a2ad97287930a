"""Capture and restore every random number generator a training step may touch.

Usage::

    from hpc.runtime import rng
    state = rng.capture()          # python, numpy, torch CPU and CUDA generators
    ...                            # draw random numbers
    rng.restore(state)             # the next draws repeat exactly

The captured state holds only ints, tuples, lists and tensors, so it round-trips through
``torch.load(..., weights_only=True)`` (numpy's array is stored as a tensor for that reason).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch

# Keys of the captured dict; a table so capture and restore cannot drift apart.
_SOURCES = ("python", "numpy", "torch", "cuda")


def _capture_numpy() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    # uint32 keys fit losslessly in int64; tensors load under weights_only, ndarrays do not.
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached": float(cached)}


def _restore_numpy(s: dict[str, Any]) -> None:
    keys = s["keys"].numpy().astype(np.uint32)
    np.random.set_state((s["kind"], keys, s["pos"], s["has_gauss"], s["cached"]))


def _capture_python() -> tuple:
    version, internal, gauss = random.getstate()
    return (version, list(internal), gauss)


def _restore_python(s: tuple) -> None:
    version, internal, gauss = s
    random.setstate((version, tuple(internal), gauss))


def _capture_cuda() -> torch.Tensor | None:
    """The generator state of this rank's device only: a resume with another GPUs-per-node split
    (2 x 4 to 1 x 8) binds each rank to a device again, and that device takes this state."""
    # Querying CUDA state would initialise CUDA in a CPU-only job; skip when unused.
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return torch.cuda.get_rng_state(torch.cuda.current_device())


def _restore_cuda(s: torch.Tensor | list[torch.Tensor] | None) -> None:
    if s is None or not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    if isinstance(s, (list, tuple)):  # written before: one state per visible device
        if device >= len(s):
            return  # this rank's device had no state of its own: its generator stays as seeded
        s = s[device]
    torch.cuda.set_rng_state(s, device)


_CAPTURE = {"python": _capture_python, "numpy": _capture_numpy,
            "torch": torch.get_rng_state, "cuda": _capture_cuda}
_RESTORE = {"python": _restore_python, "numpy": _restore_numpy,
            "torch": torch.set_rng_state, "cuda": _restore_cuda}


def capture() -> dict[str, Any]:
    """Return the state of every generator, as plain data safe for weights_only loading."""
    return {name: _CAPTURE[name]() for name in _SOURCES}


def restore(state: dict[str, Any]) -> None:
    """Put every generator back to `state` (from :func:`capture`); unknown keys are an error."""
    unknown = set(state) - set(_SOURCES)
    if unknown:
        raise ValueError(
            f"unknown RNG sources {sorted(unknown)}; expected a subset of {list(_SOURCES)}. "
            "HINT: pass the dict returned by hpc.runtime.rng.capture().")
    for name in _SOURCES:
        if name in state:
            _RESTORE[name](state[name])


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch (all devices) with one value."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def derive_seed(*values: int) -> int:
    """A 63-bit seed from several integers (seed, epoch, rank; seed, step, rank), the same on every
    machine and Python version, which hash() does not promise."""
    digest = hashlib.blake2b(":".join(map(str, values)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
