"""External mode: the command templates run the stand-in script with LangSplat's arguments.
pytest tests/test_langsplat_external.py"""
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import yaml

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "langsplat_external.yaml"


def _render(kind, **values):
    ext = yaml.safe_load(TEMPLATE.read_text())["external"]
    values = {"python": sys.executable, "iterations": 7, **values}
    values.setdefault("rgb_checkpoint", ext["rgb_checkpoint"].format(**values))
    return shlex.split(ext["standin_commands"][kind].format(**values))


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return {**env, **extra}


def test_rgb_then_two_rank_features(tmp_path):
    rgb = tmp_path / "rgb"
    subprocess.run(_render("rgb", source=tmp_path / "data", model=rgb, rgb_model=rgb),
                   check=True, env=_env())
    assert (rgb / "chkpnt7.pth").is_file()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    model = tmp_path / "features-2"
    cmd = _render("features", source=tmp_path / "data", model=model, rgb_model=rgb, level=2)
    procs = [subprocess.Popen(cmd, env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                            LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT=port)) for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    records = [json.loads((model / "standin" / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["rank_sum"] for r in records] == [1, 1]  # 0 + 1: the ranks met
    assert records[1]["args"]["feature_level"] == 2
    assert records[1]["args"]["start_checkpoint"] == str(rgb / "chkpnt7.pth")
    assert json.loads((model / "chkpnt7.pth").read_text())["world_size"] == 2


def test_features_without_rgb_checkpoint_fails_with_hint(tmp_path):
    cmd = _render("features", source=tmp_path, model=tmp_path / "f", rgb_model=tmp_path / "none", level=0)
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    assert out.returncode == 2 and "HINT" in out.stderr
