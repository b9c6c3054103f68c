"""lib_dist.horovod's pre- and postscaling (`ops.scale_`) in Horovod's arithmetic: integers in
float64, truncated back; half precision in float32 on the CPU, but in half precision on a GPU,
where Horovod's CUDA kernel rounds the factor to fp16 first (Horovod's own
`test_horovod_allreduce_postscale` holds a GPU run to that)."""

from __future__ import annotations

import pytest
import torch

from lib_dist.horovod.ops import scale_

FACTOR = 0.1  # not a power of two: fp16(0.1) != 0.1, so the two arithmetics part somewhere
HALF = torch.arange(-1000, 1000, dtype=torch.float16) / 7


def scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    t = t.clone()
    scale_(t, factor)
    return t


def test_half_precision_on_the_cpu_is_scaled_in_float32():
    in_float32 = (HALF.float() * FACTOR).half()
    in_half = HALF * torch.tensor(FACTOR, dtype=torch.float16)
    assert not torch.equal(in_float32, in_half)  # the test tells the two apart
    assert torch.equal(scaled(HALF, FACTOR), in_float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Horovod's CUDA arithmetic needs a GPU")
def test_half_precision_on_a_gpu_is_scaled_in_half_precision():
    half = HALF.cuda()
    in_half = half * torch.tensor(FACTOR, dtype=torch.float16, device="cuda")
    assert not torch.equal(in_half, (half.float() * FACTOR).half())
    assert torch.equal(scaled(half, FACTOR), in_half)


def test_integers_are_scaled_in_float64_and_truncated():
    ints = torch.arange(-50, 50, dtype=torch.int32)
    assert torch.equal(scaled(ints, 0.3), (ints.double() * 0.3).to(torch.int32))
    assert scaled(torch.tensor([7]), 0.5).item() == 3  # 3.5 truncated, as Horovod's kernel


def test_float32_and_float64_are_scaled_in_their_own_precision():
    for dtype in (torch.float32, torch.float64):
        t = torch.linspace(-3, 3, 101, dtype=dtype)
        assert torch.equal(scaled(t, FACTOR), t * torch.tensor(FACTOR, dtype=dtype))
