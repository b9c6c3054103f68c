"""GradScaler's kernels guarded in torch's dispatcher (lib_dist.integrity.kernels): the guard's
twins compute what torch's own kernels compute, bit for bit, and every name of the kernel
(torch's function, torch.ops.aten's, torch._C._VariableFunctions') passes through the guard."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from lib_dist.integrity.kernels import unscale, update_scale

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# torch's CUDA kernels are other code than its CPU ones: held to them where a GPU is
# (`make gpu-check`'s machine runs this file too)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch's CUDA kernels need a GPU"))]


def scale_cases(gen: torch.Generator):
    for case in range(400):
        exponent = float(torch.randint(-20, 128, (), generator=gen))
        scale = float(torch.rand((), generator=gen) + 0.5) * 2.0 ** exponent
        interval = int(torch.randint(1, 5, (), generator=gen))
        tracker = int(torch.randint(0, interval, (), generator=gen))
        found = float(case % 3 == 0)
        growth = 1.0 + float(torch.rand((), dtype=torch.float64, generator=gen)) * 3
        backoff = float(torch.rand((), dtype=torch.float64, generator=gen))
        yield scale, tracker, found, growth, backoff, interval


@pytest.mark.parametrize("device", DEVICES)
def test_update_scale_is_torchs_bit_for_bit(device):
    gen = torch.Generator().manual_seed(0)
    for scale, tracker, found, growth, backoff, interval in scale_cases(gen):
        def state():
            return (torch.tensor(scale, device=device),
                    torch.tensor(tracker, dtype=torch.int32, device=device))
        theirs, ours, found_inf = state(), state(), torch.tensor(found, device=device)
        torch._amp_update_scale_(*theirs, found_inf, growth, backoff, interval)
        update_scale(*ours, found_inf, growth, backoff, interval)
        case = (scale, tracker, found, growth, backoff, interval)
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1]), case


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_unscale_is_torchs_bit_for_bit(dtype, device):
    gen = torch.Generator().manual_seed(1)
    for case in range(50):
        grads = [torch.randn(int(torch.randint(1, 40, (), generator=gen)), generator=gen)
                 * 2.0 ** float(torch.randint(-10, 10, (), generator=gen)) for _ in range(3)]
        if case % 4 == 1:
            grads[1][0] = float("inf")
        if case % 4 == 2:
            grads[2][-1] = float("nan")
        grads = [g.to(dtype=dtype, device=device) for g in grads]
        inv = torch.tensor(1.0 if case % 5 == 0 else float(torch.rand((), generator=gen)) * 4,
                           device=device)
        theirs, ours = [g.clone() for g in grads], [g.clone() for g in grads]
        found_theirs, found_ours = (torch.zeros((), device=device) for _ in range(2))
        try:
            torch._amp_foreach_non_finite_check_and_unscale_(theirs, found_theirs, inv)
        except NotImplementedError as e:  # torch's CUDA kernel has no bfloat16 (2.11)
            pytest.skip(f"torch's own kernel: {e}")
        unscale(ours, found_ours, inv)
        assert torch.equal(found_ours, found_theirs), case
        for a, b in zip(ours, theirs):
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(
                a.nan_to_num(0.0), b.nan_to_num(0.0)), (dtype, case)


GUARDED = textwrap.dedent("""
    import sys
    import torch
    from lib_dist.integrity import oracles

    device = sys.argv[1]

    oracles.guard_oracles("lab07_mixed_precision")
    routes = {
        "torch": lambda name: getattr(torch, name),
        "torch.ops.aten": lambda name: getattr(torch.ops.aten, name),
        "_VariableFunctions": lambda name: getattr(torch._C._VariableFunctions, name),
    }

    def call(kernel, name):
        if name == "_amp_update_scale_":
            scale = torch.tensor(4.0, device=device)
            kernel(scale, torch.zeros((), dtype=torch.int32, device=device),
                   torch.zeros((), device=device), 2.0, 0.5, 1)
            return float(scale)
        grads = [torch.full((3,), 8.0, device=device)]
        kernel(grads, torch.zeros((), device=device), torch.tensor(0.25, device=device))
        return float(grads[0][0])

    for route, get in routes.items():
        for name in ("_amp_update_scale_", "_amp_foreach_non_finite_check_and_unscale_"):
            outside = call(get(name), name)
            oracles.enter("LossScaler")
            try:
                call(get(name), name)
                inside = "ran"
            except oracles.UsesOracle as e:
                inside = "refused" if "is what the tests compare with" in str(e) else str(e)
            finally:
                oracles.leave()
            print(route, name, outside, inside)
""")


@pytest.mark.parametrize("device", DEVICES)
def test_every_name_of_the_kernels_is_refused_inside_an_answer_and_works_outside(device):
    out = subprocess.run([sys.executable, "-c", GUARDED, device], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split("\n")
    lines = [line.split() for line in out if line]
    assert len(lines) == 6, out
    for route, name, outside, inside in lines:
        assert inside == "refused", (route, name, inside)
        assert float(outside) == (8.0 if name == "_amp_update_scale_" else 2.0), (route, name)
