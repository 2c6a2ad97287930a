"""Put on a user's script's PYTHONPATH by hpc: registers the exit that destroys a process group left
initialised and records a clean exit (hpc.scripts.scriptexit), installs hpc.scripts.hooks (framework
presets hf and accelerate), then runs the sitecustomize this one hides, if the environment has one.

In a container, the copy of hpc and its requirements that hpc carries in (hpc.container.carry) is first
on PYTHONPATH: the script's own imports of omegaconf, yaml, tqdm, ... must find the image's versions,
which the script was written for, so that copy moves to the end of sys.path, where it still serves hpc."""
import importlib.machinery
import importlib.util
import os
import sys

_CARRIED = "CARRIED.json"  # hpc.container.carry.LISTING: a folder holding it is a carried copy
_carried = [p for p in sys.path if p and os.path.isfile(os.path.join(p, _CARRIED))]
sys.path[:] = [p for p in sys.path if p not in _carried] + _carried

if os.environ.get("HPC_STACKS_SIGNAL", "").isdigit():  # hpc's hang watchdog asks for the stacks with it
    import faulthandler

    faulthandler.register(int(os.environ["HPC_STACKS_SIGNAL"]), all_threads=True, chain=False)

if os.environ.get("HPC_EXIT_RECORD"):  # hpc.scripts.scriptexit.ENV: the wrapper reads what a clean exit writes
    try:
        from hpc.scripts import scriptexit as _hpc_exit

        _hpc_exit.install(os.environ)  # first of the atexit functions, so it runs last
    except Exception as _err:  # noqa: BLE001 - never stop the script
        print(f"[hpc] exit record not installed: {_err}", file=sys.stderr, flush=True)

if os.environ.get("HPC_HOOKS"):
    try:
        from hpc.scripts import hooks as _hpc_hooks

        _hpc_hooks.install(os.environ["HPC_HOOKS"])
    except Exception as _err:  # noqa: BLE001 - a hook must never stop the script
        print(f"[hpc] framework hooks not installed: {_err}", file=sys.stderr, flush=True)

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.origin and os.path.dirname(os.path.abspath(_spec.origin)) != _here:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
