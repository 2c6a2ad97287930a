"""Skip marks of the GPU suite: every CUDA check is skipped for one reason (onerank.NO_CUDA), those
that need two GPUs for onerank.NO_TWO_GPUS."""

from __future__ import annotations

import pytest
import torch
from onerank import NO_CUDA, NO_TWO_GPUS, cuda_ready

needs_cuda = pytest.mark.skipif(not cuda_ready(), reason=NO_CUDA)
needs_two_gpus = pytest.mark.skipif(not cuda_ready() or torch.cuda.device_count() < 2,
                                    reason=NO_CUDA if not cuda_ready() else NO_TWO_GPUS)
KINDS = [pytest.param("cpu"), pytest.param("cuda", marks=needs_cuda)]  # where a test body runs
