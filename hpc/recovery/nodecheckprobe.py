"""One node's check before a stage's ranks start; hpc.recovery.nodecheck runs it as one srun step, one task per node.

    srun --ntasks-per-node=1 python -m hpc.recovery.nodecheckprobe '{"builtin": true, "command": "", "timeout_s": 60}'

Prints one line, MARK and JSON {"node", "ok", "reasons", "collective", "wall_s", "cpu_s"}, which the
batch script's wrapper reads from srun's output: no file per node (think 64 nodes of 8 ranks), one
record per check.
- builtin: the GPUs the job was given (SLURM_STEP_GPUS / SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES) each
  have a device file that opens: /dev/nvidiaN, or the node's `File=` in gres.conf, which is where
  the sandbox's fake GPUs live. Where the NVIDIA driver is loaded (/dev/nvidiactl), torch must see as
  many devices as were given and each must answer a small matmul equal to the CPU's. Then a small
  CPU computation whose answer is known.
- command: the site's check, run by the shell within the bound; exit 0 passes, its last output line
  is the reason otherwise.
- collective: an all_reduce of collective_mb across the step's nodes (nccl where GPUs answered,
  else gloo), within the bound. A node whose own checks failed still joins it, so the others do not
  wait for it. Its failure is answered apart ("collective"): every node sees it, whichever node
  caused it, so it fails no node by itself; a node that hangs it gives no answer in time, and that
  fails the node.
Nothing of torch is imported unless a GPU or the collective needs it (2-3 s of a node's CPU).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

# PORT_BASE and PORT_SPAN of hpc.runtime.distenv (a layer above): the collective's port is the training
# port shifted by half the span, so the check never holds the port its job's ranks bind next.
PORT_BASE, PORT_SPAN = 20000, 12000
CPU_BYTES = 4 << 20  # the CPU check's input: a few MB hashed, a few ms
PASSED = "passed"  # a collective that was run and gave the right sum
MARK = "HPC_NODECHECK "  # starts each answer's line: srun's output may hold other lines (a profile's echo)
_FILE = re.compile(r"(?:^|\s)File=(\S+)")
_NODE = re.compile(r"(?:^|\s)NodeName=(\S+)")


def gpu_indices(env: Mapping[str, str]) -> List[str]:
    """The GPUs the job was given on this node, as SLURM numbers them ([] for none)."""
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name, "").strip()
        if value and value not in ("NoDevFiles", "none"):
            return [v for v in value.split(",") if v]
    return []


def gres_files(text: str, node: str) -> List[str]:
    """The GPU device files gres.conf's lines name for `node`, in SLURM's index order."""
    from hpc.slurm import hostlist  # here: only a node with GPUs and a gres.conf with File= needs it

    files: List[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        named, file = _NODE.search(line), _FILE.search(line)
        if not file or "Name=gpu" not in line:
            continue
        if named and node not in hostlist.expand(named.group(1)):
            continue
        files += hostlist.expand(file.group(1))
    return files


def device_files(env: Mapping[str, str], node: str, indices: Sequence[str]) -> List[str]:
    """Each given GPU's device file: gres.conf's File= for this node where it names them, else /dev/nvidiaN."""
    conf = Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf").with_name("gres.conf")
    try:
        listed = gres_files(conf.read_text(), node)
    except (OSError, UnicodeDecodeError, ValueError):  # configless, or no GPUs declared by file
        listed = []
    return [listed[int(i)] if i.isdigit() and int(i) < len(listed) else f"/dev/nvidia{i}" for i in indices]


def check_files(files: Sequence[str]) -> List[str]:
    """A reason for each device file that is missing or does not open."""
    reasons = []
    for path in files:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        except OSError as err:
            reasons.append(f"GPU device file {path}: {err.strerror or err}")
    return reasons


def check_cuda(count: int) -> List[str]:
    """torch sees `count` devices and each answers a 256x256 matmul equal to the CPU's."""
    import torch  # here: only a node with the NVIDIA driver loaded pays for it

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen != count:
        return [f"torch sees {seen} CUDA device(s) of the {count} given"]
    a = torch.arange(256 * 256, dtype=torch.float32).reshape(256, 256) % 7
    want = a @ a
    reasons = []
    for i in range(count):
        got = (a.to(f"cuda:{i}") @ a.to(f"cuda:{i}")).cpu()
        if not torch.allclose(got, want):
            reasons.append(f"cuda:{i} computed a wrong matmul")
    return reasons


def check_cpu() -> List[str]:
    """A computation with a known answer: a few MB hashed twice give the same digest."""
    data = bytes(range(256)) * (CPU_BYTES // 256)
    return [] if hashlib.sha256(data).digest() == hashlib.sha256(bytearray(data)).digest() else ["CPU hash differs"]


def builtin(env: Mapping[str, str], node: str) -> List[str]:
    """hpc's own check: the GPUs given (their files; CUDA where the driver is loaded), and the CPU."""
    indices = gpu_indices(env)
    reasons = check_files(device_files(env, node, indices))
    if indices and not reasons and os.path.exists("/dev/nvidiactl"):
        try:
            reasons += check_cuda(len(indices))
        except Exception as err:  # a driver or runtime error is this node's failure, in one line
            reasons.append(f"CUDA: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    return reasons + check_cpu()


def site_command(command: str, timeout_s: float, env: Mapping[str, str]) -> List[str]:
    """The site's check by the shell: [] when it exits 0, else a reason with its last output line."""
    try:
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=max(1.0, timeout_s),
                              env=dict(env), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [f"site check did not end within {timeout_s:.0f} s"]
    if done.returncode == 0:
        return []
    last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
    return [f"site check exited {done.returncode}: {last[0][:200]}"]


def collective(env: Mapping[str, str], megabytes: float, timeout_s: float, gpus: bool) -> List[str]:
    """An all_reduce of `megabytes` of ones across the step's tasks (one per node) within `timeout_s`."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from hpc.slurm import hostlist

    rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    master = hostlist.expand(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])[0]
    port = PORT_BASE + (int(env.get("SLURM_JOB_ID", "0")) + PORT_SPAN // 2) % PORT_SPAN
    backend = "nccl" if gpus else "gloo"
    try:
        dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=max(1.0, timeout_s)))
        try:
            ones = torch.ones(int(megabytes * (1 << 20)) // 4, device="cuda:0" if gpus else "cpu")
            dist.all_reduce(ones)
            if float(ones[0]) != world or float(ones[-1]) != world:
                return [f"{backend} all_reduce across {world} node(s) gave {float(ones[0])}, not {world}"]
        finally:
            dist.destroy_process_group()
    except Exception as err:  # a peer that never came, a timeout: one line
        return [f"{backend} all_reduce of {megabytes:g} MB across {world} node(s): {type(err).__name__}: "
                f"{(str(err).splitlines() or [''])[0][:200]}"]
    return []


def probe(options: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> Dict[str, Any]:
    """This node's answer: its name, ok, the reasons it failed, its wall and CPU seconds."""
    start, cpu = time.monotonic(), time.process_time()
    node = env.get("SLURMD_NODENAME") or os.uname().nodename
    bound = float(options.get("timeout_s") or 60)
    reasons: List[str] = []
    if options.get("builtin", True):
        reasons += builtin(env, node)
    if options.get("command"):
        reasons += site_command(str(options["command"]), bound - (time.monotonic() - start) - 1, env)
    together: List[str] = []  # the collective's failure, which names no node by itself (hpc.recovery.nodecheck.judge)
    if options.get("collective") and int(env.get("SLURM_NTASKS", "1")) > 1:
        gpus = bool(gpu_indices(env)) and os.path.exists("/dev/nvidiactl")
        left = bound - (time.monotonic() - start) - 1
        together = collective(env, float(options.get("collective_mb") or 4), left, gpus) or [PASSED]
    children = os.times()
    return {"node": node, "ok": not reasons, "reasons": reasons, "collective": "; ".join(together),
            "wall_s": round(time.monotonic() - start, 4),
            "cpu_s": round(time.process_time() - cpu + children.children_user + children.children_system, 4)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    options = json.loads(args[0]) if args else {}
    print(MARK + json.dumps(probe(options)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
