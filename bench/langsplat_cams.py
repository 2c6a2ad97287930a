"""LangSplat stage 2 throughput: cameras per second of hpc.jobs.langsplat.stages.train_features at 1 and 2
ranks (gloo, CPU), on geometry from a short stage-1 run made in the same benchmark.

    python -m bench --only langsplat
    python -m bench.langsplat_cams --rgb OUT --iters 200                 # stage 1 only
    RANK=0 ... python -m bench.langsplat_cams --features OUT --rgb-dir D # one rank of stage 2

cameras/s = feature_iterations x cameras_per_step / seconds spent in fit_features (the training
loop, timed around the function the stage calls); the whole stage's time (scene, geometry load,
evaluation, outputs) is shown beside it. The node's torch threads are split among its ranks, as
the stage does on a real node, so 1 and 2 ranks use the same CPU.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

from bench.common import REPO, Context, child_env, emit, fmt_s, free_port, run_child
from bench.report import Section

LEVEL = 0


def stage_rgb(out: Path, iters: int) -> dict:
    from hpc.jobs.langsplat.stages import train_rgb

    return train_rgb({"trainer": {"rgb_iterations": iters}}, out)


def stage_features(out: Path, rgb_dir: Path, iters: int) -> dict:
    """train_features with fit_features timed (the stage imports it from the module at call time)."""
    import hpc.jobs.langsplat.features as features
    from hpc.jobs.langsplat.stages import train_features

    timing = {}
    original = features.fit_features

    def timed_fit(s, cfg, *args, **kwargs):
        t0 = time.perf_counter()
        loop = original(s, cfg, *args, **kwargs)
        timing.update(fit_s=time.perf_counter() - t0, steps=loop.step - loop.resumed_step,
                      cameras_per_step=cfg["cameras_per_step"])
        return loop

    features.fit_features = timed_fit
    metrics = train_features({"trainer": {"feature_iterations": iters}}, out, LEVEL, rgb_dir)
    return {**timing, "stage_s": metrics["seconds"], "world_size": metrics["world_size"]}


def launch_features(out: Path, rgb_dir: Path, iters: int, world: int) -> dict:
    port, procs = str(free_port()), []
    for rank in range(world):
        env = child_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                         "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "bench.langsplat_cams", "--features", str(out), "--rgb-dir", str(rgb_dir),
             "--iters", str(iters)], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"train_features at {world} rank(s) failed: {[o[1][-800:] for o in outs]}")
    return json.loads([ln for ln in outs[0][0].splitlines() if ln.startswith("{")][-1])


def run(ctx: Context) -> Section:
    rgb_iters, feat_iters = (40, 24) if ctx.quick else (200, 120)
    sec = Section("langsplat", "LangSplat stage 2 throughput", "cameras per second at 1 and 2 ranks",
                  "python -m bench --only langsplat" + (" --quick" if ctx.quick else ""),
                  headers=["ranks", "steps", "cameras/step", "training loop", "cameras/s", "whole stage",
                           "speed-up"])
    rgb_dir = ctx.scratch("langsplat-rgb")
    rgb = run_child("langsplat_cams", ["--rgb", str(rgb_dir), "--iters", str(rgb_iters)])
    results: Dict[int, dict] = {}
    for world in (1, 2):
        results[world] = launch_features(ctx.scratch(f"langsplat-features-{world}"), rgb_dir, feat_iters, world)
    base = None
    for world, r in results.items():
        cams = r["steps"] * r["cameras_per_step"] / r["fit_s"]
        base = base or cams
        sec.rows.append([str(world), str(r["steps"]), str(r["cameras_per_step"]), fmt_s(r["fit_s"]),
                         f"{cams:.1f}", fmt_s(r["stage_s"]), f"{cams / base:.2f}x"])
    sec.notes += [
        f"geometry from a {rgb_iters}-step stage 1 run ({rgb['gaussians']} gaussians, test PSNR "
        f"{rgb['psnr']:.1f} dB); stage 2 level {LEVEL}, {feat_iters} steps, synthetic scene defaults "
        "(jobs/langsplat/defaults.py), fresh output directory per run",
        "CPU only (gloo): the node's 2 torch threads are split between the ranks (1 rank x 2 threads "
        "vs 2 ranks x 1 thread); each rank builds the blend-weight cache of its own cameras only, "
        "and 2 ranks add a gloo all-reduce of the feature gradient per step; this is CPU scaling on a "
        "shared 2-core machine, not GPU scaling, and it varies from run to run"]
    return sec


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.langsplat_cams")
    p.add_argument("--rgb", help="run stage 1 into this directory")
    p.add_argument("--features", help="run stage 2 (this rank) into this directory")
    p.add_argument("--rgb-dir", help="stage 1 output for --features")
    p.add_argument("--iters", type=int, required=True)
    a = p.parse_args()
    if a.rgb:
        emit(stage_rgb(Path(a.rgb), a.iters))
    else:
        emit(stage_features(Path(a.features), Path(a.rgb_dir), a.iters))


if __name__ == "__main__":
    main()
