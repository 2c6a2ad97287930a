"""Run a checkout's script as `python SCRIPT ARGS...` would, with numpy scalars allowed in torch.load.

    /opt/envs/langsplat/bin/python .../hpc/jobs/langsplat/script_runner.py /opt/LangSplat/train.py -s ...

Upstream LangSplat's train.py and render.py and graphdeco's train.py call torch.load(checkpoint)
with torch's default weights_only, True since torch 2.6, and their checkpoints hold numpy float64
values (spatial_lr_scale, the cameras' extent): the weights-only unpickler refuses them. This adds
numpy's scalar and dtype types, and nothing else, to its allowed globals: every other load keeps
the check, where TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 would drop it for every file the script loads.
On torch before 2.4 (no add_safe_globals, weights_only off by default) it changes nothing.

It runs in the checkout's interpreter, which need not have hpc: standard library, numpy and torch only.
"""
import importlib.util
import os
import runpy
import sys


class _OnTorchLoad:
    """Import hook: allow_numpy_scalars() right after torch.serialization is first imported (by
    `import torch`). The runner itself does not import torch: it costs seconds of CPU, and a script
    that never imports it (preprocess.py's stand-in, a conversion script) loads no checkpoint."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "torch.serialization":
            return None
        sys.meta_path.remove(cls)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_allow(module) -> None:
                exec_module(module)
                allow_numpy_scalars()

            spec.loader.exec_module = exec_then_allow
        return spec


def allow_numpy_scalars() -> None:
    try:
        import numpy
        import torch.serialization as serialization
    except ImportError:  # a script without torch loads no checkpoint
        return
    if not hasattr(serialization, "add_safe_globals"):
        return
    core = getattr(numpy, "_core", None) or numpy.core  # numpy 2 renamed numpy.core
    dtypes = {type(numpy.dtype(kind)) for kind in (numpy.float64, numpy.float32, numpy.int64, numpy.int32)}
    serialization.add_safe_globals([core.multiarray.scalar, numpy.dtype, *dtypes])


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python script_runner.py SCRIPT [ARGS...]")
    script = os.path.abspath(sys.argv[1])
    sys.argv = [sys.argv[1], *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)  # as `python SCRIPT` sets it (not this file's folder)
    if "torch.serialization" in sys.modules:
        allow_numpy_scalars()
    else:
        sys.meta_path.insert(0, _OnTorchLoad)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
