"""hpc: SLURM-centric job toolkit.

    python -m hpc.submit langsplat --levels 0 1 2

Data flows one way: config -> plan -> submit (submitit) -> job runtime
(env -> DDP session -> training loop with checkpoints) -> run directory on disk.
Everything up to `submit` imports without torch.

Packages, layered top to bottom (a package imports only from the layers below it; tests/test_layers.py
keeps it so):

    commands and API   submit status logs cancel env launch afterstep (python -m hpc.X); ddp, trainloop
    sweep/ here/ remote/
                       grids, per-point configs, a sweep's array jobs | --cluster here: srun steps of an salloc |
                       --cluster NAME: a named cluster's login node over ssh (clusters.yaml)
    pipeline/          PipelineDef and StageDef, the pure plan, sbatch rendering, the stage task, submission
    monitor/ runtime/ container/
                       where a run stands | what runs inside a task: environment, DDP/FSDP session, data |
                       a stage's ranks in an image: the srun line, hpc carried in
    checkpoint/ recovery/ cluster/
                       checkpoint store | stop signals, requeue, node failures, hangs | the local SLURM cluster
    config/            schema, layers, checks, cache, defaults
    rundir/ slurm/     the run directory's records, code snapshot | SLURM's clients and their answers
    fs/                atomic writes, shared filesystems (python -m hpc.fs PATH)

Frozen and Record, below: the bases of hpc's immutable records (dataclasses), importable by every layer.

The Python API (hpc.api, hpc.runs, hpc.pipeline.short) is reached from here by name, loaded on first
use so that `import hpc` stays a few attributes (jobs unpickle their tasks through it):

    run = hpc.submit("langsplat", profile="sandbox", levels=[1]); run.wait()
    hpc.Run.attach(RUN_DIR).status();  hpc.define("demo", hpc.stage(fn, items=[0, 1]))
"""
import sys
from importlib.machinery import ModuleSpec

__version__ = "0.1.0"

# submitit pickles a job when it is submitted and unpickles it at every start, requeues included, so
# a job queued before hpc's modules moved into packages still names them by their old paths.
MOVED = {"hpc.executor": "hpc.pipeline.executor", "hpc.snapshot": "hpc.rundir.snapshot"}


class _Moved:
    """Import finder for MOVED's names: the old name is the new module itself."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        return ModuleSpec(name, _Moved) if name in MOVED else None

    @staticmethod
    def create_module(spec):
        import importlib

        return importlib.import_module(MOVED[spec.name])

    @staticmethod
    def exec_module(module):
        pass


sys.meta_path.append(_Moved)

# The API's names -> the module that defines them. hpc.submit is the command module hpc.submit,
# callable as the API's submit (hpc.api.submit).
API = {"submit": "hpc.submit", "Run": "hpc.runs", "Sweep": "hpc.runs", "ConfigError": "hpc.api",
       "RunDirError": "hpc.api", "SubmissionError": "hpc.api", "define": "hpc.pipeline.short",
       "stage": "hpc.pipeline.short", "ResultError": "hpc.monitor.results"}


class Frozen:
    """The base of hpc's records that stay as made: a dataclass (declared without frozen=True) whose
    __init__ sets each field once; setting a field again, or any other attribute, or deleting one raises
    dataclasses.FrozenInstanceError, as on a frozen dataclass. For a frozen class dataclasses compiles
    its own __setattr__ and __delattr__ at import; these are written once here, where a submission
    imports 16 such records (BENCHMARKS.md, section 1)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        if name in self.__dict__ or name not in self.__dataclass_fields__:
            _refuse(name)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        _refuse(name)


class Record(Frozen):
    """A Frozen record that is a value: compared, hashed and printed by its fields, as a dataclass with
    frozen=True and eq=True would be (declare it with eq=False, repr=False: these three are written
    once here rather than compiled for each class at import)."""

    __slots__ = ()

    def _fields(self, flag: str) -> tuple:
        from dataclasses import fields  # loaded already: the subclass is a dataclass

        return tuple((f.name, getattr(self, f.name)) for f in fields(self)
                     if (f.compare if flag == "hash" and f.hash is None else getattr(f, flag)))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields("compare") == other._fields("compare")

    def __hash__(self) -> int:
        return hash(tuple(value for _, value in self._fields("hash")))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={value!r}" for name, value in self._fields("repr"))
        return f"{self.__class__.__qualname__}({inner})"


def _refuse(name: str) -> None:
    from dataclasses import FrozenInstanceError  # on a refusal only: `import hpc` stays a few attributes

    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def __getattr__(name: str):
    if name not in API:
        raise AttributeError(f"module 'hpc' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(API[name])
    return module if API[name] == f"hpc.{name}" else getattr(module, name)
