"""Which Python runs each checkout's scripts, and a check that it imports that checkout's rasterizer.

    python -c "from hpc.jobs.langsplat.interpreters import probe; print(probe('/opt/envs/langsplat/bin/python'))"

graphdeco's gaussian-splatting and LangSplat each install a CUDA rasterizer under one module name,
diff_gaussian_rasterization. LangSplat's settings have an include_feature field and its rasterizer
returns three values, graphdeco's neither: in one environment, the other checkout fails at its first
render. So each checkout has its own interpreter (external.python, external.gaussian_splatting_python),
and before submission each is asked, in a subprocess, which rasterizer it imports. preprocess.py also
needs LangSplat's segment_anything (segment-anything-langsplat), whose SamAutomaticMaskGenerator
returns four mask sets where Meta's returns one.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict

from hpc.config.schema import ConfigError

LANGSPLAT, GAUSSIAN_SPLATTING = "langsplat", "gaussian_splatting"
KEYS = {LANGSPLAT: "external.python", GAUSSIAN_SPLATTING: "external.gaussian_splatting_python"}
# Runs in the interpreter under test: it imports only what the scripts themselves import.
PROBE = """
import json, sys
out = {}
try:
    import diff_gaussian_rasterization as d
    out["fields"] = list(d.GaussianRasterizationSettings._fields)
except Exception as err:
    out["error"] = type(err).__name__ + ": " + str(err)
if "sam" in sys.argv[1:]:
    try:
        from segment_anything import SamAutomaticMaskGenerator
        out["sam"] = "langsplat" if hasattr(SamAutomaticMaskGenerator, "generate_curr_anns") else "meta"
    except Exception as err:
        out["sam"] = type(err).__name__ + ": " + str(err)
print(json.dumps(out))
"""


def interpreter(ext: Any, checkout: str) -> str:
    """The interpreter of a checkout: graphdeco's falls back to external.python (the check at
    submission then says whether that can work), LangSplat's to the one running hpc."""
    if checkout == GAUSSIAN_SPLATTING and ext["gaussian_splatting_python"]:
        return ext["gaussian_splatting_python"]
    return ext["python"] or sys.executable


def probe(python: str, sam: bool = False, timeout_s: float = 600) -> Dict[str, Any]:
    """What `python` imports: {"fields": [...]} or {"error": ...}, and "sam" when asked."""
    try:
        out = subprocess.run([python, "-c", PROBE, *(["sam"] if sam else [])], capture_output=True,
                             text=True, timeout=timeout_s)
    except OSError as err:
        return {"error": f"cannot run it ({err})"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": f"exited with {out.returncode}: {out.stderr.strip().splitlines()[-1:] or ''}"}
    return json.loads(lines[-1])


def check(ext: Any, checkout: str, sam: bool = False) -> None:
    """Refuse an interpreter that lacks its checkout's rasterizer (or LangSplat's SAM), one line with a HINT."""
    python, key = interpreter(ext, checkout), KEYS[checkout]
    found = probe(python, sam)
    wants_feature = checkout == LANGSPLAT
    owner = "LangSplat's (submodules/langsplat-rasterization)" if wants_feature else "graphdeco's"
    if "error" in found:
        raise ConfigError(f"{key}={python} cannot import diff_gaussian_rasterization ({found['error']}); the "
                          f"{checkout} scripts need {owner}. HINT: install that rasterizer into the environment "
                          f"and set {key}=/path/to/env/bin/python")
    if ("include_feature" in found["fields"]) != wants_feature:
        other = "graphdeco's" if wants_feature else "LangSplat's (it takes include_feature)"
        raise ConfigError(f"{key}={python} imports {other} diff_gaussian_rasterization, but the {checkout} scripts "
                          f"need {owner}; both install that module name, so each checkout needs its own "
                          "environment. HINT: set external.python to LangSplat's environment and "
                          "external.gaussian_splatting_python to graphdeco's")
    if sam and found.get("sam") != "langsplat":
        raise ConfigError(f"{key}={python} has no LangSplat segment_anything (found: {found.get('sam')}); "
                          "preprocess.py needs segment-anything-langsplat, whose mask generator returns s, m and l "
                          "masks. HINT: pip install <LangSplat>/submodules/segment-anything-langsplat in that "
                          "environment")
