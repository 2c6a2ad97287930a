"""What the model computes in: FSDP's bf16 policy, Session.autocast() and the TF32 switches.

    python -m pytest -q tests/test_precision.py

No GPU here: a Session bound to cuda:0 stands in for a CUDA task's where nothing touches the
device. FSDP runs for real on 2 gloo ranks (tests/precision_workload.py), and its forward is
watched from inside; autocast and TF32 are torch's switches, read back as torch's ops read them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.cuda.amp.common

import hpc.ddp
from hpc.runtime.envparse import from_environ
from hpc.runtime.session import Session
import ranklaunch
from test_ddp_session import free_port

WORKLOAD = Path(__file__).with_name("precision_workload.py")
REPO = Path(__file__).resolve().parents[1]
BF16, FP32 = str(torch.bfloat16), str(torch.float32)


def test_fsdp_computes_in_bf16_for_a_cuda_session_that_asks_and_reduces_gradients_in_fp32(tmp_path):
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(ranklaunch.popen([sys.executable, str(WORKLOAD), str(tmp_path)], env=env,
                                      stderr=subprocess.PIPE, text=True))
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(errors)
    report = json.loads((tmp_path / "report.json").read_text())
    cuda, cpu = report["cuda"], report["cpu"]
    assert len(cuda["forward"]) == 3, "every Linear ran once"
    assert cuda["forward"] == [[BF16, BF16, BF16]] * 3, "input, weight and output of each Linear in bf16"
    assert cuda["shards"] == [FP32] and cuda["grads"] == [FP32], "the shards and their gradients stay fp32"
    assert cuda["fp32_sums"], "gradients reduced in bf16: every element is a bf16 value"
    # the same request in a session on the CPU: the model's own dtype, as documented
    assert cpu["forward"] == [[FP32, FP32, FP32]] * 3 and cpu["shards"] == [FP32]


def test_autocast_on_the_cpu_leaves_ops_in_fp32():
    with hpc.ddp.session(env=from_environ({}), bf16=True) as s:
        with s.autocast():
            assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32


@pytest.mark.parametrize("bf16", [False, True])
def test_autocast_on_cuda_turns_on_bf16_for_cuda_ops_when_asked(monkeypatch, bf16):
    """torch.autocast("cuda") disables itself where CUDA is missing: it is told CUDA is there."""
    monkeypatch.setattr(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    s = Session(from_environ({}), torch.device("cuda", 0), bf16=bf16)
    with s.autocast():
        assert torch.is_autocast_enabled("cuda") is bf16
        if bf16:
            assert torch.get_autocast_dtype("cuda") == torch.bfloat16
    assert not torch.is_autocast_enabled("cuda")


@pytest.fixture
def tf32_flags():
    """The flags as they were, restored after the test; each starts opposite to `tf32` below."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("tf32", [False, True])
def test_a_cuda_sessions_tf32_switch_sets_torchs_flags(monkeypatch, tf32_flags, tf32):
    monkeypatch.setattr(hpc.ddp, "_cuda_count", lambda: 1)  # one GPU: the task binds cuda:0
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not tf32
    with hpc.ddp.session(env=from_environ({}), tf32=tf32) as s:
        assert s.device == torch.device("cuda", 0)
        assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
        # what fp32 matmuls follow: "high" lets them use TF32, "highest" keeps full fp32
        assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")


def test_a_cpu_session_leaves_the_tf32_flags_alone(tf32_flags):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with hpc.ddp.session(env=from_environ({}), tf32=True) as s:
        assert s.device.type == "cpu"
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
