"""An Accelerate script under hpc: the user's `accelerate config` carried to every rank, or
`accelerate launch` given the machine rank, count and main address by hpc.

    environ(read_config(path))        # per rank: what `accelerate launch` would export from the file
    launcher_argv(argv, env, gpus)    # per node: `accelerate launch ...` with the topology filled in

Per rank (`python train.py`, one SLURM task per GPU): Accelerator() reads its settings from the
variables `accelerate launch` exports (ACCELERATE_MIXED_PRECISION, ACCELERATE_USE_CPU,
ACCELERATE_USE_FSDP and FSDP_*, ACCELERATE_DYNAMO_*), so without the launcher the settings of the
config file silently disappear. The file is read at submission (--accelerate-config, else
Accelerate's default file, $HF_HOME/accelerate/default_config.yaml) and its variables are kept in
the run's config (script.env), so a later edit of the file does not change a queued run.
DeepSpeed settings are refused here: run them per node, through `accelerate launch`.

Per node (`accelerate launch train.py`, one SLURM task per node): hpc adds --num_machines,
--machine_rank, --main_process_ip, --main_process_port and --num_processes (all the job's GPUs, or
one process per node without GPUs) unless the command already gives them; the rank variables of
hpc.launch are left out, the launcher sets its own.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from hpc.config.checks import ConfigError

# fsdp_config keys whose variable is not simply the key in capitals (accelerate.utils.launch)
FSDP_RENAMED = {"fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP"}
DYNAMO = {"dynamo_backend": "ACCELERATE_DYNAMO_BACKEND", "dynamo_mode": "ACCELERATE_DYNAMO_MODE",
          "dynamo_use_fullgraph": "ACCELERATE_DYNAMO_USE_FULLGRAPH",
          "dynamo_use_dynamic": "ACCELERATE_DYNAMO_USE_DYNAMIC",
          "dynamo_use_regional_compilation": "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"}
TOPOLOGY = ("--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port", "--num_processes")


def default_config() -> Path:
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def read_config(path: Optional[str]) -> Dict[str, Any]:
    """The config file's settings; {} when no file is named and Accelerate's default does not exist."""
    import yaml

    file = Path(path).expanduser() if path else default_config()
    if not file.is_file():
        if path:
            raise ConfigError(f"--accelerate-config {path}: no such file. HINT: run `accelerate config`, or name the "
                              "file it wrote")
        return {}
    try:
        loaded = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{file} is not a readable Accelerate config ({err}). HINT: run `accelerate config` "
                          "again") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{file} holds {type(loaded).__name__}, not Accelerate's settings. HINT: run "
                          "`accelerate config` again")
    return loaded


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def environ(config: Mapping[str, Any]) -> Dict[str, str]:
    """The variables `accelerate launch` would export to each process for this config."""
    env: Dict[str, str] = {}
    kind = str(config.get("distributed_type", "NO")).upper()
    if kind == "DEEPSPEED":
        raise ConfigError("the Accelerate config uses DeepSpeed, whose settings only `accelerate launch` passes on. "
                          "HINT: run it per node: python -m hpc.submit run --framework accelerate -- accelerate "
                          "launch train.py")
    if config.get("use_cpu") or kind == "MULTI_CPU":
        env["ACCELERATE_USE_CPU"] = "True"
    if config.get("mixed_precision") is not None:
        env["ACCELERATE_MIXED_PRECISION"] = str(config["mixed_precision"]).lower()
    for key, name in DYNAMO.items():
        value = (config.get("dynamo_config") or {}).get(key)
        if value is not None:
            env[name] = str(value).upper() if key == "dynamo_backend" else _text(value)
    if kind == "FSDP":
        env["ACCELERATE_USE_FSDP"] = "true"
        for key, value in (config.get("fsdp_config") or {}).items():
            if key.startswith("fsdp_") and value is not None:
                env[FSDP_RENAMED.get(key, key.upper())] = _text(value)
    return env


def is_launcher(argv: List[str]) -> bool:
    """`accelerate launch ...` (or a path to the accelerate entry point)."""
    return len(argv) >= 2 and os.path.basename(argv[0]) == "accelerate" and argv[1] == "launch"


def launcher_argv(argv: List[str], dist: Any, gpus_per_node: int) -> List[str]:
    """`accelerate launch` with the job's topology, per node (dist: this task's DistEnv, one per node)."""
    script_at = next((i for i, a in enumerate(argv) if i >= 2 and (a.endswith(".py") or a == "-m")), len(argv))
    given = {a.split("=")[0] for a in argv[2:script_at]}  # the launcher's own options, not the script's
    total = dist.num_nodes * max(1, gpus_per_node)
    topology = {"--num_machines": str(dist.num_nodes), "--machine_rank": str(dist.node_rank),
                "--main_process_ip": dist.master_addr, "--main_process_port": str(dist.master_port),
                "--num_processes": str(total)}
    added = [x for key in TOPOLOGY if key not in given for x in (key, topology[key])]
    return [*argv[:2], *added, *argv[2:]]
