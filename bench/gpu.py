"""The GPU suite and the GPU benchmarks in one command, and their report.

    python -m bench.gpu                    # tests/gpu, then bench.gpu_steps; writes gpu-report.md and .json
    python -m bench.gpu --no-bench         # the suite only
    python -m bench.gpu --out /tmp/r.md

Sized for one 10-minute run on one H100: the benchmarks stop being started once BUDGET_S has
passed, and each says "not measured" with the reason. Without a CUDA device it says so plainly,
runs the CPU variants of the suite (every test body also runs on the CPU: the checks themselves
are proven), measures nothing, writes a report in which no path has run on a GPU, and exits 2.
Exit status: 0 when every CUDA test passed, 1 when one failed, 2 without a GPU.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from bench.common import REPO, child_env, fmt_s, run_child

BUDGET_S = 540.0  # of the 600 s a device run may take: the rest is start-up and the report
SUITE_TIMEOUT_S = 360.0
# path of hpc -> the tests (file::name) whose CUDA runs say it works on a GPU
PATHS: Dict[str, Tuple[str, ...]] = {
    "device binding (hpc/runtime/devicebind.py, hpc.ddp._pick_device)": (
        "test_device::test_one_task_binds_cuda_0_and_nccl",
        "test_device::test_tasks_sharing_a_node_bind_cuda_local_rank"),
    "TF32 switches (hpc.ddp.session(tf32=))": ("test_device::test_the_tf32_switch_decides_what_a_float32_matmul",),
    "NCCL init and the flight recorder (hpc.ddp, hpc/recovery/hangs.py, watchdog.nccl_trace)": (
        "test_nccl_processes::test_the_flight_recorder_records", "test_nccl_processes::test_two_ranks_join_over_nccl"),
    "DDP with device_ids (Session.wrap)": ("test_collectives::test_ddp_binds_the_sessions_device",),
    "pinned loaders (Session.loader)": ("test_device::test_a_sessions_loader_pins_its_batches_on_cuda",),
    "bf16 autocast (Session.autocast)": ("test_device::test_bf16_autocast_computes_in_bf16_on_cuda_only",),
    "FSDP's mixed precision (hpc/runtime/fsdp.py)": ("test_collectives::test_fsdp_computes_in_bf16",),
    "reductions moving values to the device (Session.all_reduce_*)": (
        "test_collectives::test_reductions_reach_the_groups_device",),
    "NCCL barrier timeouts (Session.barrier, training_started)": ("test_nccl_processes::test_a_stuck_barrier_fails",),
    "the CUDA device mesh (Session.mesh)": ("test_collectives::test_the_mesh_is_on_the_sessions_device_type",),
    "meta-device materialisation on CUDA (hpc/runtime/fsdp.py)": ("test_collectives::test_a_meta_model_gets",),
    "pinned staging after every source stream (hpc/checkpoint/staging.py)": (
        "test_checkpoint_gpu::test_staging_copies_what_every_stream_wrote",),
    "DCP save and load of CUDA tensors (hpc/checkpoint/dcp_engine.py)": ("test_checkpoint_gpu::test_dcp_saves_device",),
    "the forked writer from a process with a CUDA context (hpc/checkpoint/background_writer.py)": (
        "test_checkpoint_gpu::test_the_forked_writer",),
    "scalars on CUDA streams (hpc/runtime/scalars.py)": ("test_checkpoint_gpu::test_a_logged_device_scalar",),
    "the stop vote on CUDA streams (hpc/recovery/stopsignal.py)": ("test_collectives::test_the_stop_vote",),
    "CUDA RNG capture (hpc/runtime/rng.py)": ("test_device::test_rng_capture_repeats",),
    "object broadcasts over NCCL (TrainLoop._broadcast)": ("test_collectives::test_trainloop_broadcasts",),
    "the LangSplat reference trainer on cuda:0 (jobs/langsplat)": ("test_langsplat_gpu::test_the_reference_trainer",),
}


def gpu_name() -> Optional[str]:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def run_suite(xml: Path) -> int:
    argv = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", "tests/gpu",
            f"--junitxml={xml}"]
    try:
        return subprocess.run(argv, cwd=REPO, env=child_env(), timeout=SUITE_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"[gpu] the suite ran past {SUITE_TIMEOUT_S:.0f} s and was stopped", file=sys.stderr)
        return 1


def results(xml: Path) -> Dict[str, str]:
    """'file::name[params]' -> passed, failed or skipped (with the reason), from pytest's junit XML."""
    out: Dict[str, str] = {}
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return out
    for case in root.iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        out[key] = ("failed" if bad is not None else
                    f"skipped: {skipped.get('message', '')}" if skipped is not None else "passed")
    return out


def path_rows(outcomes: Dict[str, str]) -> List[List[str]]:
    """A row per path: the outcome of its CUDA runs (a [cpu] variant never counts)."""
    rows = []
    for path, tests in PATHS.items():
        mine = {k: v for k, v in outcomes.items()
                if any(k.startswith(t) for t in tests) and "[cpu" not in k}
        if not mine:
            verdict = "not collected"
        elif any(v == "failed" for v in mine.values()):
            verdict = "FAILED"
        elif all(v == "passed" for v in mine.values()):
            verdict = "passed"
        elif any(v == "passed" for v in mine.values()):
            verdict = "passed (some checks skipped: " + "; ".join(
                sorted({v[9:] for v in mine.values() if v.startswith("skipped")})) + ")"
        else:
            verdict = "not run: " + sorted({v[9:] for v in mine.values()})[0]
        rows.append([path, verdict, ", ".join(sorted(k.split("::")[1] for k in mine))])
    return rows


def benchmarks(scratch: Path, started: float) -> List[List[str]]:
    """Rows of the GPU benchmarks, each started only while the budget lasts."""
    from bench.gpu_steps import SIZES_MB, pair_rows

    rows: List[List[str]] = []
    jobs = [("ddp", ["--pair", "ddp"]), ("fsdp", ["--pair", "fsdp"])]
    jobs += [(f"stall {mb} MB", ["--stall-mb", str(mb), "--dir", str(scratch / f"stall-{mb}")]) for mb in SIZES_MB]
    jobs += [("langsplat", ["--langsplat", str(scratch / "langsplat")])]
    for name, args in jobs:
        left = BUDGET_S - (time.time() - started)
        if left < 30:
            rows.append([name, "not measured: the 10-minute budget was spent", ""])
            continue
        try:
            r = run_child("gpu_steps", args, timeout=left)
        except Exception as err:  # one broken benchmark must not hide the others
            rows.append([name, f"not measured: {str(err).strip().splitlines()[-1][:300]}", ""])
            continue
        if name in ("ddp", "fsdp"):
            rows += [[a, b, c] for a, b, c in pair_rows(r, name.upper())]
        elif name.startswith("stall"):
            rows += [[f"checkpoint stall, {r['size_mb']} MB on cuda:0: {k}", fmt_s(v), "blocked per save"]
                     for k, v in r["blocked"].items()]
        else:
            rows += [["LangSplat stage 1 (rgb, 300 steps)", fmt_s(r["rgb_s"]),
                      f"PSNR {r['psnr']:.1f} dB, {r['gaussians']} gaussians"],
                     ["LangSplat stage 2 (features, 200 steps)", fmt_s(r["stage_s"]),
                      f"{r['steps'] * r['cameras_per_step'] / r['fit_s']:.1f} cameras/s in the training loop"]]
    return rows


def render(gpu: Optional[str], rows: List[List[str]], bench_rows: List[List[str]], suite_rc: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    out = ["# GPU suite report", "", f"Produced by `python -m bench.gpu` on {when}.  ",
           f"GPU: {gpu or 'none: no CUDA device here, so no path below has run on a GPU'}.  ",
           f"Suite exit status: {suite_rc}.", "", "| path | on a GPU | tests |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if bench_rows:
        out += ["", "## Benchmarks (one GPU)", "", "| benchmark | time | note |", "|---|---|---|"]
        out += [f"| {a} | {b} | {c} |" for a, b, c in bench_rows]
        out += ["", "DDP and FSDP: one-rank NCCL group, hand-written and hpc in alternating blocks of "
                "steps in one process, each step ending in a device synchronisation; the ratio is hpc's "
                "median step over the hand-written one's, with a bootstrap interval (bench.interleave)."]
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description="the GPU suite and GPU benchmarks")
    p.add_argument("--out", default=str(REPO / "gpu-report.md"), help="report path (JSON beside it)")
    p.add_argument("--no-bench", action="store_true", help="the suite only")
    args = p.parse_args(argv)
    started, gpu = time.time(), gpu_name()
    if gpu is None:
        print("[gpu] no CUDA device here (torch.cuda.is_available() is False): nothing can run on a GPU. "
              "Running the CPU variants of tests/gpu only, measuring nothing; exit status 2", file=sys.stderr)
    out = Path(args.out)
    scratch = out.parent / (out.stem + "-scratch")
    scratch.mkdir(parents=True, exist_ok=True)
    suite_rc = run_suite(scratch / "junit.xml")
    rows = path_rows(results(scratch / "junit.xml"))
    bench_rows = benchmarks(scratch, started) if gpu and not args.no_bench else []
    out.write_text(render(gpu, rows, bench_rows, suite_rc))
    out.with_suffix(".json").write_text(json.dumps(
        {"gpu": gpu, "suite_exit": suite_rc, "paths": rows, "benchmarks": bench_rows}, indent=1) + "\n")
    print(f"wrote {out} ({time.time() - started:.0f} s)")
    if gpu is None:
        return 2
    return 0 if suite_rc == 0 and not any(r[1] == "FAILED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
