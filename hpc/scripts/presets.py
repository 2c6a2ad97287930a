"""Framework presets: what makes each framework's unmodified script preempt and resume correctly.

    preset = choose("auto", command, code_dir)       # --framework auto|lightning|hf|accelerate|torchtitan|none
    env = preset.environ(num_nodes=2, tasks_per_node=4)

- lightning: num_nodes and devices from the allocation as defaults (PL_TRAINER_NUM_NODES,
  PL_TRAINER_DEVICES: a script's own values win); its requeue signal, USR1, at the time-limit
  warning and at a preemption, so that it saves hpc_ckpt_N.ckpt and resumes from it by itself. Its
  SIGTERM, which stops it without saving, is held back (hpc.launch --block-term) and passed on as
  USR1; the wrapper ends the script when it has not exited by the deadline.
- hf: the HF Trainer saves a checkpoint and stops at the next step on SIGTERM, and resumes from the
  newest complete checkpoint-N of its output_dir, incomplete ones set aside (hooks in the script's
  interpreter: hpc.scripts.hooks).
- accelerate: Accelerator.load_state() without a folder takes the newest complete checkpoint_i
  (hooks); the user's `accelerate config` file reaches a per-rank script as the variables
  `accelerate launch` would export (hpc.scripts.accelerate).
- torchtitan: resumes by itself from its dump folder (./outputs, in the working directory);
  incomplete step-N folders are set aside.
- none: a plain torchrun-style script: SIGTERM at the warning; the resume contract (--resume-if).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

FRAMEWORKS = ("auto", "lightning", "hf", "accelerate", "torchtitan", "none")


@dataclass(frozen=True)
class Preset:
    name: str
    packages: tuple = ()  # one of these must be importable by the job's interpreter
    warn: str = "TERM"  # the signal the script gets at the time-limit warning
    preempt_as: Optional[str] = None  # a preemption passed on as this (SIGTERM then blocked in the script)
    resume_if: str = ""  # checkpoints to check and set aside before each launch, unless the user gives one
    hooks: bool = False  # hpc.scripts.hooks in the script's interpreter

    def environ(self, num_nodes: int, tasks_per_node: int) -> Dict[str, str]:
        env = {"HPC_FRAMEWORK": self.name}
        if self.name == "lightning":
            env.update(PL_TRAINER_NUM_NODES=str(num_nodes), PL_TRAINER_DEVICES=str(tasks_per_node))
        if self.hooks:
            env["HPC_HOOKS"] = self.name
        return env


PRESETS = {
    "none": Preset("none"),
    "lightning": Preset("lightning", ("lightning", "pytorch_lightning"), warn="USR1", preempt_as="USR1",
                        resume_if="hpc_ckpt_*.ckpt"),
    "hf": Preset("hf", ("transformers",), hooks=True),
    "accelerate": Preset("accelerate", ("accelerate",), hooks=True),
    "torchtitan": Preset("torchtitan", ("torchtitan",), resume_if="outputs/checkpoint/step-*"),
}

# What `auto` looks for in the script's source, most specific first.
SIGNS = (
    ("torchtitan", re.compile(rb"\btorchtitan\b")),
    ("lightning", re.compile(rb"^\s*(import|from)\s+(lightning|pytorch_lightning)\b", re.M)),
    ("hf", re.compile(rb"^\s*from\s+transformers\s+import\s+[^\n]*\bTrainer\b", re.M)),
    ("accelerate", re.compile(rb"^\s*from\s+accelerate\s+import\s+[^\n]*\bAccelerator\b", re.M)),
)


def script_of(command: Sequence[str], code_dir: Optional[Path]) -> Optional[Path]:
    """The Python file a command runs (`python train.py`, `accelerate launch train.py`), if any."""
    for arg in command[1:]:
        if arg.endswith(".py"):
            path = Path(arg)
            if not path.is_absolute() and code_dir is not None:
                path = code_dir / path
            return path if path.is_file() else None
    return None


def detect(command: Sequence[str], code_dir: Optional[Path]) -> str:
    """The framework a command's script uses, by the imports in its source; 'none' when unsure."""
    text = " ".join(command)
    if "torchtitan" in text:
        return "torchtitan"
    script = script_of(command, code_dir)
    try:
        source = script.read_bytes()[:1 << 20] if script else b""
    except OSError:
        source = b""
    for name, sign in SIGNS:
        if sign.search(source):
            return name
    return "none"


def choose(name: str, command: Sequence[str], code_dir: Optional[Path]) -> Preset:
    if name not in FRAMEWORKS:
        raise ValueError(f"framework {name!r}; expected one of {', '.join(FRAMEWORKS)}")
    return PRESETS[detect(command, code_dir) if name == "auto" else name]
