"""The CUDA paths of a node's check before training and of an attempt's software record.

    python -m pytest -n 0 tests/gpu/test_node_and_software_gpu.py    # on a GPU machine: python -m bench.gpu

Here each CUDA test is skipped (marks.needs_cuda); the CPU side of both is tested in tests/test_nodecheck.py
and tests/test_software_record.py.
"""

from __future__ import annotations

import os
import socket

import torch
from marks import needs_cuda

from hpc.recovery import nodecheckprobe
from hpc.rundir import software


@needs_cuda
def test_every_gpu_given_answers_its_matmul_and_one_more_than_torch_sees_is_named():
    count = torch.cuda.device_count()
    assert nodecheckprobe.check_cuda(count) == []
    assert nodecheckprobe.check_cuda(count + 1) == [f"torch sees {count} CUDA device(s) of the {count + 1} given"]


@needs_cuda
def test_the_builtin_check_of_a_gpu_node_opens_its_device_files_and_passes():
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(torch.cuda.device_count()))}
    assert nodecheckprobe.gpu_indices(env), "the check must see the GPUs it was given"
    assert nodecheckprobe.builtin(env, socket.gethostname()) == []


@needs_cuda
def test_the_collective_of_one_node_runs_on_nccl_within_its_bound():
    env = {**os.environ, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "127.0.0.1",
           "SLURM_JOB_ID": str(os.getpid())}
    assert nodecheckprobe.collective(env, 8, 60, gpus=True) == []


@needs_cuda
def test_the_software_record_names_the_driver_gpu_cuda_and_nccl():
    torch.cuda.init()
    rec = software.record()
    assert rec["cuda"] == torch.version.cuda
    assert rec["nccl"] == ".".join(map(str, torch.cuda.nccl.version()))
    if os.path.exists(software.NVIDIA):  # the driver's /proc entry: absent in some containers
        assert rec["driver"] and rec["gpu"], rec
        assert torch.cuda.get_device_name(0).split()[-1] in rec["gpu"], (rec["gpu"], torch.cuda.get_device_name(0))
