"""An optimizer's state for DCP, taken as it is: without the step torch takes to fill it in.

    watch(optimizer)                        # before training: from now on, its steps are noted
    with as_it_is(optimizer, stepped(optimizer)):
        get_state_dict(model, optimizer)    # no step taken, no gradient allocated

torch.distributed.checkpoint.state_dict fills in an optimizer's state before it reads or loads
it: when the optimizer holds no state and no parameter has a gradient, get_state_dict and
set_state_dict give every trainable parameter a zero gradient and step the optimizer with lr=0.
Before an optimizer's first step that builds the state a checkpoint of Adam or SGD with momentum
must hold. For an optimizer that keeps no state (SGD without momentum) it is repeated at every
save and every load for nothing: a gradient the size of the model is allocated and written, and
the optimizer steps over every parameter, while training waits (a save's staging and a stop's
final save run in the training thread).

So the state is taken as it is when it is known to be complete:
- at a save, when the optimizer has stepped since it was watched: an empty state then is all it
  keeps (an optimizer that keeps state has it after its first step);
- at a load, when the checkpoint holds no optimizer state: the target must not make up state
  the checkpoint cannot fill.
Otherwise torch's own filling-in runs, as before. `as_it_is` relies on torch's rule that a
parameter with a gradient means the state needs no filling in: it sets one zero gradient, on
the smallest trainable parameter, for the duration. Were that rule to change, torch would fill
the state in again, which is slower but as correct (tests/test_dcp.py counts the steps).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import torch

__all__ = ["watch", "stepped", "as_it_is", "OPTIMIZER_STATE_PREFIX"]

# The keys DCP stores an optimizer's per-parameter state under, in a checkpoint's index
# (dcp_engine.state_dicts saves it as "optimizer", get_state_dict's dict has it as "state").
OPTIMIZER_STATE_PREFIX = "optimizer.state."

_watched: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
_stepped: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()


def watch(optimizer: torch.optim.Optimizer | None) -> None:
    """Note this optimizer's steps from now on (idempotent)."""
    if optimizer is None or optimizer in _watched:
        return
    _watched.add(optimizer)
    optimizer.register_step_post_hook(_note_step)


def _note_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    _stepped.add(optimizer)


def stepped(optimizer: torch.optim.Optimizer | None) -> bool:
    """Whether the optimizer has stepped since it was watched."""
    return optimizer is not None and optimizer in _stepped


@contextlib.contextmanager
def as_it_is(optimizer: torch.optim.Optimizer | None, skip: bool) -> Iterator[None]:
    """With `skip`, DCP's state-dict calls inside take the optimizer's state as it is (see the
    module docstring); the parameter's gradient is None again afterwards."""
    if not skip or optimizer is None or optimizer.state:
        yield
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if not params or any(p.grad is not None for p in params):
        yield  # torch takes the state as it is already
        return
    smallest = min(params, key=lambda p: p.numel())
    smallest.grad = torch.zeros_like(smallest)
    try:
        yield
    finally:
        smallest.grad = None
