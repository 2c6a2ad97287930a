"""External mode's stage targets: each runs one unmodified script of the user's checkout.

    python -m hpc.submit langsplat langsplat.mode=external langsplat.data_path=/data/scene \
        external.langsplat_dir=/opt/LangSplat ...   # see hpc.jobs.langsplat.external

Every script runs through hpc.scripts.runner.run_argv, which notes SLURM's stop signals and requeues the
job once the script has died of them (the real scripts ignore SIGTERM). A requeued training stage
restarts the same script with --start_checkpoint pointing at the newest chkpnt<N>.pth it wrote:
3DGS and a 13-entry LangSplat checkpoint restore the iteration. The scripts read and write one
scene view, <run>/scene/<name>/ (hpc.jobs.langsplat.scene_view): nothing is written into the
dataset. Each script runs in its checkout's interpreter (hpc.jobs.langsplat.interpreters) through
script_runner.py, which lets torch.load's weights-only default read the numpy scalars the
checkpoints hold.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import zipfile
from pathlib import Path
from typing import Any, List, Optional

# train.py binds a GUI socket (no reuse flag): two tasks on one node with its default port (55555,
# 3DGS: 6009) would collide, so each gets a free one.
from hpc.runtime.ports import free_port

from . import checkout as co
from . import interpreters as py
from .colmap import registered_images, stem
from .external import FINAL_CHECKPOINT, dataset_rgb_checkpoint, has_features, image_files
from .scene_view import link as _link
from .scene_view import make_view

RUNNER = str(Path(__file__).with_name("script_runner.py"))

FEATURE_DIRS = ("language_features", "language_features_dim3")


class Stage:
    """A task's view of the run: paths and the checkout's interpreter and scripts."""

    def __init__(self, ctx: Any):
        self.ctx, self.cfg = ctx, ctx.cfg
        self.ext, self.data = ctx.cfg["external"], Path(ctx.cfg["langsplat"]["data_path"]).resolve()
        self.name = self.data.name
        self.mode = co.detect(self.ext["langsplat_dir"], self.ext["gaussian_splatting_dir"])
        self.run = Path(ctx.run_dir)
        self.scene = self.run / "scene" / self.name
        self.output = self.run / "output" / self.name  # train.py's -m: it adds _<level>

    def script(self, rel: str, graphdeco: bool = False) -> List[str]:
        """The interpreter of the script's checkout, the runner, the script."""
        if graphdeco:
            return [py.interpreter(self.ext, py.GAUSSIAN_SPLATTING), RUNNER,
                    str(Path(self.ext["gaussian_splatting_dir"]) / rel)]
        return [py.interpreter(self.ext, py.LANGSPLAT), RUNNER, str(Path(self.ext["langsplat_dir"]) / rel)]

    def make_scene(self) -> Path:
        """The scene view (idempotent; array tasks may build it at the same time)."""
        make_view(self.data, self.scene, [d for d in FEATURE_DIRS if has_features(self.data / d, str(self.data))])
        for name in FEATURE_DIRS:
            if not (self.scene / name).exists():
                (self.scene / name).mkdir(exist_ok=True)
        return self.scene

    def ae_name(self) -> str:
        """--dataset_name: the folder under ckpt/ that eval reads (upstream adds ae_ckpt/)."""
        return self.name if self.mode == co.FORK else f"{self.name}/ae_ckpt"

    def ae_dirs(self) -> List[str]:
        return ["--encoder_dims", *map(str, self.ext["encoder_dims"]),
                "--decoder_dims", *map(str, self.ext["decoder_dims"])]

    def rgb_model(self) -> Path:
        """Where the RGB stage's train.py writes (graphdeco: -m as given; fork train.py: -m + _-1)."""
        return self.output if self.ext["gaussian_splatting_dir"] else Path(f"{self.output}_-1")

    def rgb_checkpoint(self) -> Path:
        iterations = self.ext["iterations"]
        return dataset_rgb_checkpoint(str(self.data), iterations) or self.rgb_model() / f"chkpnt{iterations}.pth"

    def run_script(self, argv: List[str], stage: str, launch: bool = False, cwd: Optional[Path] = None,
                   env: Optional[dict] = None) -> dict:
        """Scripts that resolve paths against the working directory (autoencoder, eval) get `cwd`."""
        from hpc.scripts.runner import run_argv  # the script runner: only in the task, never when planning

        if cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
        return run_argv(self.ctx, argv, self.cfg["stages"][stage]["max_timeouts"], launch=launch, cwd=cwd, env=env)


def checkpoint_iterations(final: int, every: int) -> List[int]:
    """A cadence plus the final iteration; 30000 only when it is the final one, since render.py
    loads chkpnt30000.pth as the trained model."""
    cadence = [i for i in range(every, final, every) if i != FINAL_CHECKPOINT] if every > 0 else []
    return [*cadence, final]


def newest_checkpoint(model: Path) -> Optional[Path]:
    """The chkpnt<N>.pth with the largest N the script wrote completely (links made by hpc do
    not count). The scripts torch.save straight to the final name, so a stop while saving leaves
    a truncated file: torch.save writes a zip archive whose end record comes last, and a file
    without one is skipped, with a line saying so, for the one before it."""
    found = sorted(((int(m.group(1)), p) for p in model.glob("chkpnt*.pth")
                    if (m := re.fullmatch(r"chkpnt(\d+)\.pth", p.name)) and not p.is_symlink()), reverse=True)
    for _, path in found:
        if zipfile.is_zipfile(path):
            return path
        print(f"[hpc] skipping {path}: not a complete torch.save archive (stopped while writing it?)",
              file=sys.stderr, flush=True)
    return None


def preprocess(ctx: Any) -> dict:
    st = Stage(ctx)
    st.make_scene()
    per = st.ext["images_per_shard"]
    shard = st.run / "preprocess" / f"task-{ctx.item}" / st.name
    (shard / "images").mkdir(parents=True, exist_ok=True)
    for name in image_files(str(st.data))[ctx.item * per:(ctx.item + 1) * per]:
        with contextlib.suppress(FileExistsError):
            (shard / "images" / name).symlink_to(st.data / "images" / name)
    _link(st.scene / "language_features", shard / "language_features")  # results land in the view
    argv = st.script("preprocess.py") + ["--dataset_path", str(shard), "--sam_ckpt_path",
                                         str(Path(st.ext["sam_checkpoint"]).resolve())]
    return st.run_script(argv, "preprocess", env=co.offline_env(st.ext["clip_hf_home"]))


def merge(ctx: Any) -> dict:
    st = Stage(ctx)
    folder = st.make_scene() / "language_features"
    missing = [n for n in image_files(str(st.data)) for k in "fs" if not (folder / f"{stem(n)}_{k}.npy").is_file()]
    if missing:
        raise RuntimeError(f"{folder} lacks {len(missing)} file(s), e.g. {missing[:3]}; every image needs "
                           "<name>_f.npy and <name>_s.npy. HINT: see the preprocess tasks' logs and resubmit")
    return {"images": len(image_files(str(st.data)))}


def ae_train(ctx: Any) -> dict:
    st = Stage(ctx)
    argv = st.script("autoencoder/train.py") + [
        "--dataset_path", str(st.make_scene()), "--dataset_name", st.ae_name(), *st.ae_dirs(),
        "--lr", str(st.ext["ae_lr"]), "--num_epochs", str(st.ext["ae_epochs"])]
    return st.run_script(argv, "ae_train", cwd=st.run / "autoencoder")  # writes ckpt/<name>/ there


def ae_encode(ctx: Any) -> dict:
    st = Stage(ctx)
    argv = st.script("autoencoder/test.py") + [
        "--dataset_path", str(st.make_scene()), "--dataset_name", st.ae_name(), *st.ae_dirs()]
    return st.run_script(argv, "ae_encode", cwd=st.run / "autoencoder")  # reads ckpt/<name>/ there


def rgb(ctx: Any) -> dict:
    st = Stage(ctx)
    iterations = st.ext["iterations"]
    if st.ext["gaussian_splatting_dir"]:
        argv = st.script("train.py", graphdeco=True)
    else:
        argv = st.script("train.py") + ["--no_include_feature"]
    argv += ["-s", str(st.make_scene()), "-m", str(st.output), "--iterations", str(iterations),
             "--checkpoint_iterations", *map(str, checkpoint_iterations(iterations, st.ext["checkpoint_every"])),
             "--port", str(free_port())]
    resume = newest_checkpoint(st.rgb_model())
    if resume is not None:
        argv += ["--start_checkpoint", str(resume)]
    return st.run_script(argv, "rgb")


def features(ctx: Any) -> dict:
    st = Stage(ctx)
    level, model = int(ctx.item), Path(f"{st.output}_{int(ctx.item)}")
    resumed = newest_checkpoint(model)
    start = resumed or st.rgb_checkpoint()
    common = ["-s", str(st.make_scene()), "-m", str(st.output), "--feature_level", str(level),
              "--start_checkpoint", str(start)]
    if st.mode == co.FORK:
        final, flags = ddp_schedule(st, ctx.env.world_size)
        argv = st.script("train_ddp.py") + common + flags + ["--dist_backend", st.ext["dist_backend"]]
    else:
        final, argv = st.ext["iterations"], st.script("train.py") + common + [
            "--iterations", str(st.ext["iterations"]), "--port", str(free_port())]
    argv += ["--checkpoint_iterations", *map(str, checkpoint_iterations(final, st.ext["checkpoint_every"]))]
    done = iteration_of(resumed) if resumed else -1
    if done >= final:
        # requeued on fewer ranks (views) or more (updates) than the run that wrote it: the script
        # would train nothing and save nothing, so its checkpoint is the level's final one
        print(f"[hpc] {resumed} is at iteration {done}, past this world size's final {final}: "
              "the level is trained", file=sys.stderr, flush=True)
        result, final = {"exit_code": 0}, done
    else:
        result = st.run_script(argv, "features", launch=st.mode == co.FORK)
    if ctx.env.rank == 0 and final != FINAL_CHECKPOINT:
        _link_file(model / f"chkpnt{final}.pth", model / f"chkpnt{FINAL_CHECKPOINT}.pth")
    return {**result, "final_iteration": final}


def iteration_of(checkpoint: Path) -> int:
    return int(re.fullmatch(r"chkpnt(\d+)\.pth", checkpoint.name).group(1))


def ddp_schedule(st: Stage, world: int):
    """(final iteration, flags) for train_ddp.py on `world` ranks (see external.ddp_equivalence)."""
    iterations, cameras = st.ext["iterations"], len(registered_images(st.data))
    if st.ext["ddp_work"] == "updates":
        return iterations * world, ["--iterations", str(iterations), "--match_single_gpu_updates"]
    epochs = max(1, round(iterations / cameras))
    return epochs * (cameras // world), ["--epochs", str(epochs), "--scale_lr"]


def _link_file(target: Path, link: Path) -> None:
    """link -> target, replacing a link an earlier attempt made (on another rank count, to
    another final checkpoint); a file the script wrote under that name stays."""
    if not target.is_file() or (link.exists() and not link.is_symlink()):
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(target.name)
    os.replace(tmp, link)


def render(ctx: Any) -> dict:
    st = Stage(ctx)
    argv = st.script("render.py") + ["-m", f"{st.output}_{int(ctx.item)}", "--include_feature"]
    return st.run_script(argv, "render")


def eval(ctx: Any) -> dict:  # noqa: A001 - the stage's name
    from .external import label_dir

    st = Stage(ctx)
    ae_dir = st.ext["ae_ckpt_dir"] or str(st.run / "autoencoder" / "ckpt")
    argv = st.script("eval/evaluate_iou_loc.py") + [
        "--dataset_name", st.name, "--feat_dir", str(st.output.parent), "--ae_ckpt_dir", ae_dir,
        "--output_dir", str(st.run / "eval"), "--json_folder", str(label_dir(_Cfg(ctx.cfg))), *st.ae_dirs()]
    # it appends ".." to sys.path to import autoencoder.model: it must run in the checkout's eval/
    return st.run_script(argv, "eval", cwd=Path(st.ext["langsplat_dir"]) / "eval",
                         env=co.offline_env(st.ext["clip_hf_home"]))


class _Cfg:
    """Attribute access on the task's plain config dict, for the planning helpers."""

    def __init__(self, d: dict):
        self._d = d

    def __getattr__(self, key: str) -> Any:
        value = self._d[key]
        return _Cfg(value) if isinstance(value, dict) else value
