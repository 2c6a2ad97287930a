"""Stages whose ranks run inside a container image: Pyxis/enroot, Apptainer, or any prefix command.

    python -m hpc.submit langsplat --profile sandbox --dry-run \\
        cluster.container.runtime=pyxis cluster.container.image=/images/torch.sqsh   # the srun line shows it

Only the ranks run inside. The batch script, hpc.afterstep (the srun wrapper) and every SLURM call
stay on the host, where scontrol and sbatch are: a rank that must be requeued writes what it decided
into the run directory, and the host carries it out (hpc.recovery.hostact).

A stage's `container` section wins when its runtime is set, else `cluster.container` holds for
every stage. resolve() checks it against the file system and adds the mounts hpc needs itself, each
at the same path inside as outside: the run directory (submitit's folder lives in it; a sweep's point
mounts its sweep directory), the store of its root where the code snapshot is, $HPC_CACHE_DIR,
the submission directory, and every absolute path in the pipeline's own sections of the config
that exists (data, checkouts, model files); a path the runtime's mount list cannot carry (UNSAFE: ','
or ':', and for Pyxis whitespace and shell characters) is refused, and an image file is named by
its absolute path. launch() turns the result into the srun line:

    pyxis      srun ... --container-image=IMG --container-mounts=A:A,... --container-name=hpc-<hash>
               --no-container-mount-home [--container-workdir=W] [--container-env=K,...] PYTHON -u -m ...
    apptainer  srun ... apptainer exec [--nv] --bind A:A,... [--pwd W] IMG PYTHON -u -m ...
    exec       srun ... PREFIX... PYTHON -u -m ...

With container.hpc=carry (the default), PYTHON there is `sh -c 'export PYTHONPATH=<copy>...; exec "$0"
"$@"' PYTHON`: the ranks import hpc and its pure-Python requirements from the copy that prepare() makes
at submission (hpc.container.carry), so an image with torch alone runs them; `image`: the image's own hpc.

Pyxis: `squash` names a shared .sqsh file that prepare() imports a registry image to once, at
submission (hpc.container.squash); the srun lines then name the file. The container name is a hash of
the run directory, the stage and the image, so every step of a job on a node starts from the image
unpacked once, and a changed image gets a new name (Pyxis removes named containers when the job ends
unless the site sets container_scope=global); the home directory stays out
(--no-container-mount-home), as it is on a cluster's login node only. Environment: `env` is exported
by the batch script and, for pyxis, named in --container-env so that it wins over the image's
values; for apptainer, as APPTAINERENV_<NAME>, which Apptainer sets over the image's value (a host
variable it passes only where the image sets none). The rank variables (RANK, WORLD_SIZE, MASTER_*)
that enroot's PyTorch hook sets are overwritten in each task from SLURM's (hpc.runtime.envparse: in
an srun step SLURM's variables win).
Apptainer runs without --cleanenv: the tasks need SLURM_*.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc import Record
from hpc.config.checks import ConfigError
from hpc.config.schema import to_dict
from hpc.rundir import snapcache
from hpc.rundir.sweepdir import is_sweep

RUNTIMES = ("pyxis", "apptainer", "exec")
IN_IMAGE = ("slurm", "here")  # the plan kinds whose ranks run in the image; the local executor's run on the host
HPC_FROM = ("carry", "image")  # container.hpc: a copy hpc carries in (hpc.container.carry), or the image's own
# config sections that are hpc's own: their paths are not data (the run directory is mounted anyway)
OWN_SECTIONS = ("run", "cluster", "stages")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# characters a runtime's mount list cannot carry in a path: ',' separates the entries and ':' the parts
# of one; Pyxis writes each entry into an `echo "SRC DST FLAGS"` line of the shell config enroot reads
# as fstab lines: whitespace splits the fields (Pyxis 0.24 escapes it as \040, earlier ones do not, so
# hpc cannot escape it for both), and the shell expands $, ` and \ and ends the line at "
UNSAFE = {"pyxis": ",: \t\n\\\"$`", "apptainer": ",:"}
# what each of hpc's own mounts is, and how to move it where its runtime can mount it
OWN_MOUNTS = {"run": ("the run directory", "pass --run-dir (or run.root=) a path without them"),
              "cache": ("$HPC_CACHE_DIR", "set HPC_CACHE_DIR to a folder without them"),
              "cwd": ("the submit directory", "submit from a directory without them"),
              "data": ("a path in the config", "move or link it to a path without them and give that one")}


@dataclass(eq=False, repr=False)
class Launch(Record):
    """What the batch script gets: srun options, the interpreter text before `-u -m ...`, and shell lines."""

    srun_args: Tuple[str, ...]
    python: str
    setup: Tuple[str, ...]


def effective(stage: Mapping[str, Any], cluster: Mapping[str, Any]) -> Dict[str, Any]:
    """The section a stage runs with: its own when it names a runtime, else the cluster's."""
    own = dict(stage or {})
    return own if own.get("runtime") else dict(cluster or {})


def resolve(section: Mapping[str, Any], where: str, run_dir: str, cfg: Mapping[str, Any],
            stage: str = "") -> Optional[Dict[str, Any]]:
    """The checked section with every mount hpc adds (`mounts`: SRC:DST[:FLAGS] strings) and the
    pyxis container name of `stage`'s jobs; None without a runtime. `where`: the config key, for errors."""
    runtime = section.get("runtime") or ""
    if not runtime:
        return None
    if runtime not in RUNTIMES:
        raise ConfigError(f"{where}.runtime={runtime!r}; expected one of {list(RUNTIMES)} (or '' for none). "
                          f"HINT: set {where}.runtime=pyxis, apptainer, or exec with {where}.prefix=[...].")
    image, prefix = section.get("image") or "", list(section.get("prefix") or [])
    if runtime == "exec":
        if not prefix:
            raise ConfigError(f"{where}.runtime=exec with no {where}.prefix; expected the command the ranks run "
                              f"under. HINT: set {where}.prefix=[bwrap,--bind,/,/] or another wrapper.")
        if section.get("mounts") or section.get("workdir"):
            raise ConfigError(f"{where}.mounts or .workdir set with runtime exec, which mounts nothing and moves "
                              f"nowhere itself. HINT: put the binds and the directory (--chdir) into {where}.prefix.")
    elif not image:
        raise ConfigError(f"{where}.image is empty for runtime {runtime}; expected an image. HINT: set "
                          f"{where}.image=/path/to/image.{'sqsh' if runtime == 'pyxis' else 'sif'}.")
    elif _is_path(image):  # absolute: Pyxis reads local.sqsh as a registry name, and a task's directory differs
        image = os.path.abspath(os.path.expanduser(image))
        if not os.path.exists(image):
            raise ConfigError(f"{where}.image={image!r} does not exist on this machine; expected the image "
                              "file. HINT: fix the path, or import it first (enroot import / apptainer pull).")
    # a stage's container alone loads these: a submission without one never does
    from hpc.container import carry, squash

    pull = str(section.get("squash") or "")
    if pull:  # pyxis: the registry image imported once to this file, at submission (prepare)
        squash.check(pull, image, runtime, where)
    hpc_from = section.get("hpc") or "carry"
    if hpc_from not in HPC_FROM:
        raise ConfigError(f"{where}.hpc={hpc_from!r}; expected one of {list(HPC_FROM)}. HINT: set {where}.hpc=carry "
                          "(hpc brings itself into the image), or image when the image has hpc installed.")
    carried = carry.folder() if hpc_from == "carry" else ""
    root, cache = _mount_root(run_dir), str(snapcache.cache_dir())
    # the store of the run root, where the code snapshot the jobs run is (hpc.rundir.snapcache); the
    # submission directory too: `run` reads its git-ignored data, and --no-snapshot imports it; the
    # cache holds hpc's carried copy, made at submission (prepare) where this dry run finds no cache yet
    store = [(str(snapcache.store_of(root)), "run")] if (cfg.get("run") or {}).get("snapshot", True) else []
    ours = [(root, "run"), *store, *[(p, k) for p, k in ((cache, "cache"), (os.getcwd(), "cwd"))
                             if os.path.isdir(p) or (k == "cache" and carried)], *[(p, "data") for p in data_paths(cfg)]]
    users = [_user_mount(m, where, root) for m in section.get("mounts") or []]
    for path, kind in ours:
        _check_mount(path, runtime, *OWN_MOUNTS[kind])
    for text, parts in zip(section.get("mounts") or [], users):
        for path in parts[:2]:
            _check_mount(path, runtime, f"{where}.mounts entry {text!r}: the path", "mount it from a path without them")
    env = {str(k): str(v) for k, v in (section.get("env") or {}).items()}
    bad = [k for k in env if not _ENV_NAME.fullmatch(k)]
    if bad:
        raise ConfigError(f"{where}.env has name(s) {bad} that are not variable names; expected letters, "
                          "digits and '_'. HINT: rename them.")
    mounts = [f"{p}:{p}" for p in _outermost([p for p, _ in ours]) if not any(_covers(u, p) for u in users)] + \
        [":".join(u) for u in users]
    name = "hpc-" + hashlib.sha256(f"{run_dir}\0{stage}\0{image}".encode()).hexdigest()[:12]
    return {**dict(section), "runtime": runtime, "mounts": mounts, "env": env, "name": name, "prefix": prefix,
            "python": section.get("python") or "python", "hpc": hpc_from, "carry": carried,
            "image": pull or image, "pull": image if pull else ""}


def prepare(jobs: Sequence[Any]) -> List[str]:
    """Before sbatch: what the srun lines of `jobs` name is made: the copy of hpc (hpc.container.carry)
    and a Pyxis image's .sqsh file (hpc.container.squash); what each cost, in words, once each."""
    boxes = [j.resources.get("container") or {} for j in jobs]
    pulls = {b["image"]: b["pull"] for b in boxes if b.get("pull")}
    carried = sorted({b.get("carry") for b in boxes} - {None, ""})
    if not carried and not pulls:
        return []
    from hpc.container import carry, squash  # as in resolve(): only for a stage's container

    return [*(carry.ensure(where).summary() for where in carried),
            *(squash.ensure(path, image) for path, image in sorted(pulls.items()))]


def notes(jobs: Sequence[Any], kind: str = "slurm", cfg: Any = None) -> List[str]:
    """The plan's notes on what a submission makes for the containers: where their ranks import hpc
    from, and a Pyxis image imported to a file; for the local executor (`kind`), that the container
    sections of `cfg` (the run's config) are not used."""
    if kind not in IN_IMAGE:
        stages, cluster = (to_dict(cfg.stages), to_dict(cfg.cluster)) if cfg is not None else ({}, {})
        names = sorted({j.stage for j in jobs if effective((stages.get(j.stage) or {}).get("container") or {},
                                                           cluster.get("container") or {}).get("runtime")})
        return [f"the {kind} executor runs stage(s) {', '.join(names)} on this machine, outside their container: "
                "only SLURM's steps run in an image. HINT: --cluster slurm, or --cluster here in an salloc shell"
                ] * bool(names)
    boxes = [j.resources.get("container") or {} for j in jobs]
    pulls = {b["image"]: b["pull"] for b in boxes if b.get("pull")}
    return [f"hpc in the containers: a copy of hpc and its pure-Python requirements at {w}, first on PYTHONPATH "
            "inside, made at submission unless an earlier one made it (container.hpc=carry; image: the image's "
            "own hpc)" for w in sorted({b.get("carry") for b in boxes} - {None, ""})] + \
        [f"image: {image} is imported to {path} at submission unless it is there (enroot import, once, under a "
         "lock); the jobs run that file" for path, image in sorted(pulls.items())]


def launch(c: Mapping[str, Any], gpus_per_node: int) -> Launch:
    """The srun options, interpreter text and export lines of a resolved section (resolve())."""
    env = dict(c.get("env") or {})
    # Apptainer lets a host variable through only where the image sets none; APPTAINERENV_<NAME> wins
    exported = "APPTAINERENV_" if c["runtime"] == "apptainer" else ""
    setup = tuple(f"export {exported}{k}={shlex.quote(v)}" for k, v in env.items())
    python, workdir, mounts = str(c["python"]), c.get("workdir"), ",".join(c["mounts"])
    if c.get("carry"):  # hpc's copy first on PYTHONPATH inside the image
        from hpc.container import carry  # as in resolve(): only for a stage's container

        python = carry.wrap(c["carry"], python)
    if c["runtime"] == "pyxis":
        args = [f"--container-image={c['image']}", f"--container-mounts={mounts}", f"--container-name={c['name']}",
                "--no-container-mount-home"]
        args += [f"--container-workdir={workdir}"] * bool(workdir) + [f"--container-env={','.join(env)}"] * bool(env)
        return Launch(tuple(args), python, setup)
    if c["runtime"] == "apptainer":
        words = ["apptainer", "exec", *["--nv"] * bool(gpus_per_node), "--bind", mounts,
                 *(["--pwd", workdir] if workdir else []), c["image"]]
        return Launch((), f"{shlex.join(words)} {python}", setup)
    return Launch((), f"{shlex.join(c['prefix'])} {python}", setup)


def data_paths(cfg: Mapping[str, Any]) -> List[str]:
    """Every absolute path that exists among the values of the pipeline's own config sections."""
    found: List[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)
        elif isinstance(node, str) and node.startswith("/") and os.path.exists(node):
            found.append(os.path.normpath(node))
    for key, value in cfg.items():
        if key not in OWN_SECTIONS:
            walk(value)
    return found


def _is_path(image: str) -> bool:
    """A file image (not a registry reference such as nvcr.io#nvidia/pytorch:24.05-py3 or docker://...)."""
    return "://" not in image and "#" not in image and (image.startswith(("/", "./", "../", "~"))
                                                        or image.endswith((".sqsh", ".sif", ".img")))


def _mount_root(run_dir: str) -> str:
    """The run directory, or its sweep's directory (a point's manifest and the sweep's record)."""
    path = os.path.abspath(run_dir)
    parent = os.path.dirname(path)
    return parent if is_sweep(parent) else path


def _user_mount(text: str, where: str, root: str) -> Tuple[str, ...]:
    """SRC[:DST[:FLAGS]], checked: the source exists, and the mount hides no part of the run directory."""
    parts = tuple(str(text).split(":"))
    if not 1 <= len(parts) <= 3 or not all(parts[:2]) or not parts[0].startswith("/") or "," in text:
        raise ConfigError(f"{where}.mounts entry {text!r}; expected SRC[:DST[:FLAGS]] with absolute paths and no "
                          "commas. HINT: write /data/set:/data/set:ro.")
    src, dst = parts[0], parts[1] if len(parts) > 1 else parts[0]
    if not os.path.exists(src):
        raise ConfigError(f"{where}.mounts source {src!r} does not exist on this machine; expected a path to "
                          "mount. HINT: create it, fix the path, or drop the mount.")
    src, dst = os.path.normpath(src), os.path.normpath(dst)
    if (_covers(dst, root) or _covers(root, dst)) and src != dst:
        raise ConfigError(f"{where}.mounts entry {text!r} would hide the run directory {root} inside the container; "
                          "expected a mount beside it, or the same path on both sides. HINT: mount it elsewhere, "
                          "or pass --run-dir outside its destination.")
    return (src, dst, *parts[2:])


def _check_mount(path: str, runtime: str, what: str, fix: str) -> None:
    """`path` holds none of the characters `runtime`'s mount list cannot carry (UNSAFE)."""
    seen = sorted({c for c in path if c in UNSAFE.get(runtime, "")})
    if seen:
        raise ConfigError(f"{what} {path!r} holds {', '.join(map(repr, seen))}, which {runtime}'s mount list cannot "
                          f"carry; expected a path without any of {', '.join(map(repr, UNSAFE[runtime]))}. HINT: {fix}.")


def _covers(outer: Any, inner: str) -> bool:
    outer = outer[1] if isinstance(outer, tuple) else outer
    return PurePosixPath(inner) == PurePosixPath(outer) or PurePosixPath(outer) in PurePosixPath(inner).parents


def _outermost(paths: Sequence[str]) -> List[str]:
    """The paths without those inside another one, in order, each once."""
    kept: List[str] = []
    for p in paths:
        if not any(_covers(k, p) for k in kept):
            kept = [k for k in kept if not _covers(p, k)] + [p]
    return kept
