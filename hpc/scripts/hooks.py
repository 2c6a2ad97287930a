"""Hooks in the interpreter of an unmodified HF Trainer or Accelerate script (presets hf, accelerate).

    environ(preset, task_dir)    # in the wrapper: PYTHONPATH gets hpc/scripts/site/, whose
                                 # sitecustomize calls install() in the script's interpreter

Neither framework saves on SLURM's signals or checks that the checkpoint it resumes from is whole.
The hooks change no behaviour of theirs but these, and only once the framework module is imported:

- transformers.Trainer: a callback that stops at a step all ranks agree on after SIGTERM or the
  time-limit signal (hpc.recovery.stopsignal's StopVote, polled about every 0.1 s of training),
  with a checkpoint saved there; and train() with no resume_from_checkpoint resumes from the
  newest complete checkpoint-N of output_dir (hpc.checkpoint.complete), rank 0 first setting
  incomplete ones aside (HPC_SET_ASIDE_DIR).
- accelerate.Accelerator.load_state() with no folder, under automatic checkpoint naming: the same,
  for checkpoints/checkpoint_i, and the next automatic save numbered after the one loaded (Accelerate
  would number it 0 again and refuse to overwrite checkpoint_0).
"""
from __future__ import annotations

import importlib.abc
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from hpc.checkpoint.complete import SET_ASIDE, step_of
from hpc.scripts import resume
from hpc.scripts.scriptwatch import STACKS_SIGNAL

SITE = Path(__file__).with_name("site")  # holds the sitecustomize that calls install()


def environ(preset: Any, task_dir: Path, pythonpath: str = "") -> Dict[str, str]:
    """What the wrapper adds to the script's environment: hpc's sitecustomize first on PYTHONPATH
    (before `pythonpath`, the script's own), which registers the stacks signal of the hang watchdog
    (hpc.scripts.scriptwatch) and, for a preset with hooks, installs them."""
    path = [str(SITE), *[p for p in pythonpath.split(os.pathsep) if p]]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path)), "HPC_STACKS_SIGNAL": str(int(STACKS_SIGNAL))}
    if preset.hooks:
        env.update(HPC_HOOKS=preset.name, HPC_SET_ASIDE_DIR=str(Path(task_dir) / SET_ASIDE))
    return env


def newest_complete(folder: Path, pattern: str, set_aside: bool) -> Optional[Path]:
    """The newest complete checkpoint in folder; with set_aside, incomplete ones are moved out first,
    as the wrapper's own resume plan does (hpc.scripts.resume)."""
    aside_dir = os.environ.get("HPC_SET_ASIDE_DIR") if set_aside else None
    attempt = {"job": os.environ.get("SLURM_JOB_ID", "0"), "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}

    def put_aside(path: Path, why: str) -> None:
        try:
            dest = resume.set_aside(path, Path(str(aside_dir)).parent, attempt)
            print(f"[hpc] set aside {path} -> {dest}: {why}", file=sys.stderr, flush=True)
        except OSError as err:
            print(f"[hpc] could not set aside {path} ({err}); resuming from an older one", file=sys.stderr)
    return resume.newest_complete(pattern, Path(folder), put_aside if aside_dir else None)


def _hf(trainer_module: Any) -> None:
    import transformers

    from hpc.recovery.stopsignal import CheckSchedule, StopFlag, StopVote  # in the script, once transformers is

    class StopOnSignal(transformers.TrainerCallback):
        """Save and stop at the step every rank agrees on after a stop signal."""

        def __init__(self) -> None:
            self.flag = StopFlag().install()
            self.schedule: Any = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if self.schedule is None:
                device = args.device if getattr(args.device, "type", "cpu") == "cuda" else "cpu"
                self.schedule = CheckSchedule(StopVote(self.flag, device=device))
            if self.schedule.due(state.global_step) and self.schedule.poll(state.global_step):
                print(f"[hpc] stop signal: saving at step {state.global_step} and stopping", file=sys.stderr,
                      flush=True)
                control.should_save = True
                control.should_training_stop = True
            return control

    trainer_cls = trainer_module.Trainer
    original_init, original_train = trainer_cls.__init__, trainer_cls.train

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.add_callback(StopOnSignal())

    def train(self: Any, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint is None and self.args.output_dir:
            last = newest_complete(Path(self.args.output_dir), "checkpoint-*", self.args.process_index == 0)
            if last is not None:
                print(f"[hpc] resuming from {last}", file=sys.stderr, flush=True)
                resume_from_checkpoint = str(last)
        return original_train(self, resume_from_checkpoint, *args, **kwargs)

    trainer_cls.__init__, trainer_cls.train = __init__, train


def _accelerate(accelerator_module: Any) -> None:
    cls = accelerator_module.Accelerator
    original = cls.load_state

    def load_state(self: Any, input_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
        config = self.project_configuration
        if input_dir is None and config.automatic_checkpoint_naming:
            folder = Path(config.project_dir) / "checkpoints"
            if self.is_main_process:
                newest_complete(folder, "checkpoint_*", set_aside=True)
            self.wait_for_everyone()
            last = newest_complete(folder, "checkpoint_*", set_aside=False)
            if last is not None:
                input_dir = str(last)
                result = original(self, input_dir, *args, **kwargs)
                config.iteration = step_of(last) + 1  # the next automatic save: after the one loaded
                return result
        return original(self, input_dir, *args, **kwargs)

    cls.load_state = load_state


PATCHES = {"hf": ("transformers.trainer", _hf), "accelerate": ("accelerate.accelerator", _accelerate)}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after its module is first imported (nothing is imported earlier)."""

    def __init__(self, module: str, patch: Any) -> None:
        self.module, self.patch, self.busy = module, patch, False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.module or self.busy:
            return None
        self.busy = True
        try:
            from importlib.util import find_spec
            spec = find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        loader, patch = spec.loader, self.patch

        class Patched(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                patch(module)

        spec.loader = Patched()
        return spec


def install(name: str) -> List[str]:
    """Install the hooks of preset `name` (hf, accelerate) in this interpreter."""
    if name not in PATCHES:
        return []
    module, patch = PATCHES[name]
    if module in sys.modules:
        patch(sys.modules[module])
    else:
        sys.meta_path.insert(0, _AfterImport(module, patch))
    return [module]
