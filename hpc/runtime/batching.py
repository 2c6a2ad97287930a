"""Elastic batch planning: the same effective batch on 1, 2, 4 or 8 devices.

    python -c "from hpc.runtime.batching import plan_batch; print(plan_batch(64, 16, 2))"

Given a global batch (what the optimizer sees per step), the most samples one device can hold
and the world size, pick the micro-batch and the number of accumulation steps so that
micro_batch * accum_steps * world_size == global_batch exactly. The learning rate then needs
no change (rule 'none'); when the global batch itself grows with the device count, 'linear'
(Goyal et al.) or 'sqrt' (Adam-style) rescales it. Pure: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpc import Record

__all__ = ["BatchPlan", "plan_batch", "scale_lr", "LR_RULES"]


@dataclass(eq=False, repr=False)
class BatchPlan(Record):
    micro_batch: int  # samples per device per forward/backward
    accum_steps: int  # forward/backward passes per optimizer step (DDP syncs on the last)
    world_size: int
    global_batch: int  # micro_batch * accum_steps * world_size

    @property
    def per_device_batch(self) -> int:
        return self.micro_batch * self.accum_steps

    def sync_step(self, micro_step: int) -> bool:
        """True on the micro-step whose backward must all-reduce gradients (the last one)."""
        return (micro_step + 1) % self.accum_steps == 0


def plan_batch(global_batch: int, per_device_max: int, world_size: int) -> BatchPlan:
    """Largest micro-batch <= per_device_max that divides the per-device share exactly."""
    for name, value in (("global_batch", global_batch), ("per_device_max", per_device_max),
                        ("world_size", world_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; expected a positive integer")
    if global_batch % world_size:
        lower = global_batch - global_batch % world_size
        nearest = " or ".join(str(n) for n in (lower, lower + world_size) if n)  # no 0: not a batch
        raise ValueError(
            f"global batch {global_batch} does not split evenly over {world_size} devices. "
            f"HINT: use a multiple of {world_size}, e.g. {nearest}"
        )
    share = global_batch // world_size
    # The smallest accumulation count whose micro-batch fits; it must divide the share so
    # that every optimizer step sees exactly global_batch samples.
    accum = next(a for a in range(math.ceil(share / per_device_max), share + 1) if share % a == 0)
    return BatchPlan(micro_batch=share // accum, accum_steps=accum, world_size=world_size,
                     global_batch=global_batch)


# rule -> factor applied to base_lr given ratio = global_batch / base_batch
LR_RULES = {
    "none": lambda ratio: 1.0,
    "linear": lambda ratio: ratio,
    "sqrt": math.sqrt,
}


def scale_lr(base_lr: float, base_batch: int, global_batch: int, rule: str = "none") -> float:
    """Learning rate for global_batch, given base_lr was tuned at base_batch."""
    if rule not in LR_RULES:
        raise ValueError(f"lr scaling rule {rule!r} unknown; expected one of {sorted(LR_RULES)}")
    if base_batch < 1 or global_batch < 1:
        raise ValueError(f"batch sizes must be positive, got base={base_batch}, global={global_batch}")
    return base_lr * LR_RULES[rule](global_batch / base_batch)
