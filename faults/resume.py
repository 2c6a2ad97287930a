"""A dropout and augmentation model, stopped by SIGTERM or SIGKILL and resumed, ends bitwise equal.

    python -m faults.reliability          # runs dropout_resume among the other campaigns

The model draws dropout masks from the global torch RNG, and the dataset augments every sample
(noise and a random sign) from the same RNG, in the main process. Data comes from s.loader, the
loop is hpc.trainloop.TrainLoop with periodic background checkpoints. A SIGTERM is the stop a
preemption sends (checkpoint at the step boundary); a SIGKILL of the whole process group loses
everything after the last periodic checkpoint. Either way the resumed run must end with the
weights of the run that was never stopped, to the bit.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import torch

from faults.common import Outcome, Victim

TOTAL, SAVE_EVERY, SAMPLES, BATCH = 24, 4, 40, 4  # 10 steps per epoch: stops land mid-epoch


class Augmented(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.x = torch.randn(SAMPLES, 6, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        x = self.x[i] + 0.1 * torch.randn(6)  # global RNG, as torchvision's transforms use it
        return x if torch.rand(()) < 0.5 else -x


def train(out, directory: Path, stop_at: int | None = None, sig: int = signal.SIGTERM,
          mode: str = "thread") -> None:
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        del os.environ[key]  # a local run: a stop is not requeued
    os.environ["HPC_CHECKPOINT_MODE"] = mode
    from hpc import ddp
    from hpc.runtime import rng
    from hpc.recovery.preemption import JobNotRequeued
    from hpc.trainloop import TrainLoop

    try:
        with ddp.session(env=None) as s:
            rng.seed_all(0)
            model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            loader = s.loader(Augmented(), batch_size=BATCH, seed=3)
            with TrainLoop(s, directory, save_every=SAVE_EVERY, tensorboard=False) as loop:
                loop.resume({"model": model, "optimizer": opt, "data": loader})
                batches = loader.batches()
                for step in loop.steps(TOTAL):
                    x = next(batches)
                    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    if step == stop_at:
                        os.killpg(0, sig) if sig == signal.SIGKILL else os.kill(os.getpid(), sig)
            torch.save([p.detach() for p in model.parameters()], directory / "weights.pt")
            out.write(f"finished {loop.resumed_step}\n")
    except JobNotRequeued:
        out.write("stopped\n")


def weights(directory: Path) -> list[torch.Tensor]:
    return torch.load(directory / "weights.pt", weights_only=True)


def trial(directory: Path, stop_at: int, sig: int, mode: str, clean: list[torch.Tensor]) -> str:
    """'' when the run stopped at `stop_at` by `sig` and resumed ends bitwise equal to `clean`."""
    first = Victim(train, directory, stop_at, sig, mode).finish()
    if first != (["stopped"] if sig == signal.SIGTERM else []):
        return f"the run to be stopped by {signal.Signals(sig).name} at step {stop_at} said {first}"
    lines = Victim(train, directory, None, sig, mode).finish()
    if not (lines and lines[0].startswith("finished")):
        return f"the resumed run did not finish: {lines}"
    got = weights(directory)
    if all(torch.equal(a, b) for a, b in zip(got, clean)):
        return ""
    diff = max(float((a - b).abs().max()) for a, b in zip(got, clean))
    return (f"{signal.Signals(sig).name} at step {stop_at} ({mode}), resumed from "
            f"{lines[0].split()[1]}: max abs weight difference {diff:.3g}")


def dropout_resume(scratch: Path, trials: int, seed: int) -> Outcome:
    Victim(train, scratch / "clean").finish()
    clean = weights(scratch / "clean")
    rnd = random.Random(seed)
    outcome = Outcome(0, 0, f"{TOTAL} steps, checkpoint every {SAVE_EVERY}, SIGTERM and SIGKILL "
                      "alternately, thread and fork writers")
    for i in range(trials):
        sig = (signal.SIGTERM, signal.SIGKILL)[i % 2]
        outcome.add(trial(scratch / f"trial-{i}", rnd.randint(1, TOTAL - 1), sig,
                          ("thread", "fork")[(i // 2) % 2], clean))
    return outcome
