"""lib_dist.mixed_precision against torch: the formats' bits are the ones torch stores;
LossScaler makes torch.amp.GradScaler's decisions (same scales, same skipped steps, same
state) and also unscales half-precision gradients; MasterWeights lets fp16 weights take updates
below half an ulp; DistributedLossScaler makes every rank skip together; ZeroOptimizer on 1-4
simulated ranks equals an unsharded AdamW on the average gradient, with 1/N of its state and
exactly one reduce-scatter and one all-gather per step; and the memory arithmetic is the ZeRO
paper's."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lib_dist.comm import SimulatedWorld
from lib_dist.comm.algorithms import ring
from lib_dist.errors import RankFailure
from lib_dist.mixed_precision import (FORMATS, DistributedLossScaler, LossScaler, MasterWeights,
                                      ZeroOptimizer, bytes_per_parameter, decode, encode,
                                      format_table, optimizer_state_bytes, torch_bits,
                                      zero_bytes_per_rank, zero_traffic_per_rank)

F64 = torch.float64
INF, NAN = math.inf, math.nan
RANKS = [1, 2, 3, 4]


# -- formats -----------------------------------------------------------------------------------


def f32(value: float) -> float:
    """`value` rounded to fp32 (a Python float again)."""
    return torch.tensor(value, dtype=F64).float().double().item()


def f32_next(value: float, toward: float) -> float:
    """The fp32 number next to fp32 `value` in the direction of `toward`."""
    return torch.nextafter(torch.tensor(value, dtype=torch.float32),
                           torch.tensor(toward, dtype=torch.float32)).double().item()


def sample_values(fmt) -> list[float]:
    """Numbers of every magnitude from below fp32's subnormals to beyond its largest, both
    signs, and each format's edges: its largest number, the rounding boundary above it and the
    numbers either side of it, its smallest normal and subnormal numbers, halfway below them
    (ties to even) and either side of that, and ±0, ±inf.

    torch converts float64 to the 16- and 8-bit formats through fp32, rounding twice
    (`test_torch_rounds_float64_to_half_precision_through_fp32`); `encode` rounds once. So for
    those formats the values are fp32 numbers, as a tensor being cast holds them."""
    rng = random.Random(0)
    values = [0.0, -0.0, INF, -INF, 1.0, -1.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 / 3, 0.1]
    for _ in range(4000):
        values.append(rng.choice((-1.0, 1.0)) * 2.0 ** rng.uniform(-155.0, 130.0))
    for _ in range(1000):  # subnormals and the normal range's bottom of every format
        f = rng.choice(list(FORMATS.values()))
        values.append(rng.uniform(-2.0, 2.0) * f.finfo.tiny)
    for f in FORMATS.values():
        top, tiny, sub = f.finfo.max, f.finfo.tiny, f.smallest_subnormal
        ulp = 2.0 ** (math.floor(math.log2(top)) - f.mantissa_bits)
        for v in (top, top + ulp / 2, top + ulp, 4 * top, tiny, tiny - sub / 2, sub, sub / 2,
                  1.5 * sub, 2.5 * sub):
            near = [v] if fmt.bits == 32 else []
            if abs(v) < 3e38:
                near += [f32(v), f32_next(f32(v), 0.0), f32_next(f32(v), INF)]
            values += near + [-x for x in near]
    return values if fmt.bits == 32 else [f32(v) for v in values]


@pytest.mark.parametrize("name", list(FORMATS))
def test_encode_gives_the_bits_torch_stores(name):
    fmt = FORMATS[name]
    bad = [(v, encode(v, fmt), torch_bits(v, fmt)) for v in sample_values(fmt)
           if encode(v, fmt) != torch_bits(v, fmt)]
    assert not bad, f"{len(bad)} values differ, e.g. {bad[:3]}"


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8 e5m2"])
def test_torch_rounds_float64_to_half_precision_through_fp32(name):
    """A float64 a hair below the midpoint between the format's largest number and the next
    power of two: rounded once (encode) it is the largest number; torch rounds it to fp32
    first, which lands on the midpoint, a tie, which rounds to even: inf."""
    fmt = FORMATS[name]
    top = fmt.finfo.max
    value = (top + 2.0 ** (math.floor(math.log2(top)) - fmt.mantissa_bits) / 2) * (1 - 2.0**-40)
    assert decode(encode(value, fmt), fmt) == top
    assert math.isinf(decode(torch_bits(value, fmt), fmt))
    assert torch_bits(value, fmt) == encode(f32(value), fmt)


@pytest.mark.parametrize("name", list(FORMATS))
def test_nan_is_encoded_as_a_nan(name):
    """No one nan: torch stores fp32's, fp16's and bf16's with only the quiet bit of the
    mantissa set, encode with all of it; both are nan patterns and decode to nan."""
    fmt = FORMATS[name]
    for value in (NAN, -NAN):
        for bits in (encode(value, fmt), torch_bits(value, fmt)):
            sign, exponent, mantissa = bits.split()
            assert exponent == "1" * fmt.exponent_bits and "1" in mantissa
            assert math.isnan(decode(bits, fmt))


@pytest.mark.parametrize("name", list(FORMATS))
def test_decode_of_torchs_bits_is_torchs_value(name):
    fmt = FORMATS[name]
    for v in sample_values(fmt):
        want = torch.tensor(v, dtype=F64).to(fmt.dtype).double().item()
        got = decode(torch_bits(v, fmt), fmt)
        assert got == want and math.copysign(1, got) == math.copysign(1, want), (v, got, want)


@pytest.mark.parametrize("name", [name for name, f in FORMATS.items() if f.bits <= 16])
def test_decode_inverts_encode_on_every_bit_pattern_of_the_small_formats(name):
    """Every fp8 pattern, every 7th of the 16-bit formats' against torch's reading of it."""
    fmt = FORMATS[name]
    for pattern in range(0, 2**fmt.bits, 1 if fmt.bits == 8 else 7):
        raw = format(pattern, f"0{fmt.bits}b")
        bits = f"{raw[0]} {raw[1:1 + fmt.exponent_bits]} {raw[1 + fmt.exponent_bits:]}"
        value = decode(bits, fmt)
        stored = torch.tensor([pattern - (2**fmt.bits if raw[0] == "1" and fmt.bits == 16
                                          else 0)], dtype=torch.int16 if fmt.bits == 16
                              else torch.uint8).view(fmt.dtype).double().item()
        if math.isnan(value):
            assert math.isnan(stored)
            continue
        assert value == stored and encode(value, fmt) == bits


def test_format_table_agrees_with_the_bit_layout_and_torch_finfo():
    rows = {row["format"]: row for row in format_table()}
    assert list(rows) == ["fp32", "fp16", "bf16", "fp8 e4m3", "fp8 e5m2"]
    for name, fmt in FORMATS.items():
        row, info = rows[name], torch.finfo(fmt.dtype)
        E, M = fmt.exponent_bits, fmt.mantissa_bits
        assert row["bits"] == info.bits == 1 + E + M
        # from the bits: the largest finite pattern, the smallest normal and subnormal ones
        largest = f"0 {'1' * E} {'1' * (M - 1)}0" if not fmt.has_inf else f"0 {'1' * (E - 1)}0 {'1' * M}"
        assert row["max"] == info.max == decode(largest, fmt)
        assert row["smallest normal"] == info.tiny == decode(f"0 {'0' * (E - 1)}1 {'0' * M}", fmt)
        assert row["smallest subnormal"] == decode(f"0 {'0' * E} {'0' * (M - 1)}1", fmt)
        assert torch.tensor(row["smallest subnormal"], dtype=F64).to(fmt.dtype).item() > 0
        assert torch.tensor(row["smallest subnormal"] / 2, dtype=F64).to(fmt.dtype).item() == 0
        assert row["eps"] == info.eps == 2.0**-M
    assert rows["fp8 e4m3"]["max"] == 448 and rows["fp16"]["max"] == 65504


# -- LossScaler against torch.amp.GradScaler -------------------------------------------------

HYPERS = [
    dict(),
    dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=1),
    dict(init_scale=2.0**20, growth_factor=1.5, backoff_factor=0.75, growth_interval=2),
    dict(init_scale=3.0, growth_factor=1.5, backoff_factor=0.75, growth_interval=3),
    # factors that fp32 cannot hold: GradScaler multiplies in double and rounds once
    dict(init_scale=1234.567, growth_factor=1.1, backoff_factor=0.3, growth_interval=1),
    dict(init_scale=3e38, growth_factor=4.0, backoff_factor=0.9, growth_interval=1),
]


def gradient_stream(steps: int = 40, seed: int = 0) -> list[torch.Tensor]:
    """Per step, the g of loss = (p * g).sum(): ordinary, with inf or nan, or huge (1e34:
    finite until the scale exceeds some 1e4, then inf once scaled)."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        g = [rng.uniform(-1, 1) for _ in range(4)]
        kind = rng.random()
        if kind < 0.15:
            g[rng.randrange(4)] = rng.choice((INF, -INF))
        elif kind < 0.25:
            g[rng.randrange(4)] = NAN
        elif kind < 0.45:
            g[rng.randrange(4)] = 1e34
        out.append(torch.tensor(g))
    return out


class CountingSGD(torch.optim.SGD):
    """SGD that counts the steps it really took."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.steps = 0

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


def scaled_step(scaler, optimizer, p, g) -> None:
    optimizer.zero_grad()
    scaler.scale((p * g).sum()).backward()
    scaler.step(optimizer)
    scaler.update()


@pytest.mark.parametrize("hyper", HYPERS, ids=str)
def test_loss_scaler_makes_grad_scalers_decisions(hyper):
    ours, theirs = LossScaler(**hyper), torch.amp.GradScaler("cpu", **hyper)
    # before its first step GradScaler reports init_scale as given; both then hold it in fp32
    assert ours.state_dict() == {**theirs.state_dict(), "scale": f32(theirs.get_scale())}
    p = torch.tensor([0.5, -1.0, 2.0, 0.25], requires_grad=True)
    q = p.detach().clone().requires_grad_()
    opt_p, opt_q = (CountingSGD([t], lr=0.1, momentum=0.9) for t in (p, q))
    scales, skips = [], 0
    for g in gradient_stream():
        before = opt_p.steps
        opt_p.zero_grad()
        ours.scale((p * g).sum()).backward()
        ours.step(opt_p)
        skipped = ours.skipped
        ours.update()
        scaled_step(theirs, opt_q, q, g)
        assert skipped == (opt_p.steps == before)
        skips += skipped
        assert opt_p.steps == opt_q.steps
        assert torch.equal(p, q)
        assert ours.get_scale() == theirs.get_scale()
        assert ours.state_dict() == theirs.state_dict()
        scales.append(ours.get_scale())
    assert skips >= 5 and len(set(scales)) >= 3  # the stream did exercise the scaler


def test_loss_scaler_checks_the_order_of_calls_as_grad_scaler_does():
    for scaler in (LossScaler(), torch.amp.GradScaler("cpu")):
        p = torch.ones(2, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.1)
        scaler.scale(p.sum()).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.unscale_(opt)
        scaler.step(opt)
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.step(opt)
        with pytest.raises(RuntimeError, match="after step"):
            scaler.unscale_(opt)
        scaler.update()
        scaler.scale(p.sum()).backward()  # a new iteration: allowed again
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    with pytest.raises(RuntimeError):
        LossScaler().update()  # nothing unscaled since the last update
    with pytest.raises(RuntimeError, match="closure"):
        LossScaler().step(torch.optim.SGD([p], lr=0.1), closure=lambda: 0.0)


def test_unscale_divides_by_the_scale_once():
    scaler = LossScaler(init_scale=1024.0)
    p = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    g = torch.tensor([0.1, 2.0, -3.0])
    scaler.scale((p * g).sum()).backward()
    assert torch.equal(p.grad, g * 1024)
    scaler.unscale_(opt)
    assert torch.equal(p.grad, g)
    scaler.step(opt)  # no second unscale
    assert torch.equal(p.detach(), 1 - 0.1 * g)


class RecordOps(TorchDispatchMode):
    """The aten operators run inside it, by name: on a GPU each one is a kernel launched, and
    `aten._local_scalar_dense` (`.item()`, `bool(t)`) a wait until the device has finished."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class NoStep:
    """An optimizer whose step does nothing: only the scaler's own operators are recorded."""

    def __init__(self, params):
        self.param_groups = [{"params": params}]

    def step(self):
        return None


def test_loss_scaler_waits_once_per_step_and_launches_as_much_for_any_number_of_gradients():
    """fp32 and bf16 gradients (two groups), steps that are clean, grow the scale, and overflow:
    every step reads one flag from the device, as GradScaler does, and runs the same operators
    for 40 gradients as for 4 (a check per gradient would wait 40 times)."""
    values = [1.0, 2.0, INF, 3.0, NAN, 1.0]
    recorded = {}
    for n in (4, 40):
        for name, scaler in (("ours", LossScaler(init_scale=4.0, growth_interval=2)),
                             ("torch", torch.amp.GradScaler("cpu", init_scale=4.0,
                                                            growth_interval=2))):
            params = [torch.zeros(3, dtype=torch.bfloat16 if k % 2 else torch.float32)
                      for k in range(n)]
            optimizer, steps, scales = NoStep(params), [], []
            scaler.scale(torch.ones(()))  # GradScaler creates its scale on first use
            for value in values:
                for k, p in enumerate(params):
                    p.grad = torch.full_like(p, value if k == n - 1 else 1.0)
                before = scaler.get_scale()
                with RecordOps() as record:
                    scaler.step(optimizer)
                    scaler.update()
                steps.append(record.ops)
                assert params[0].grad[0].item() == 1.0 / before  # unscaled, in both groups
                assert params[1].grad[0].item() == 1.0 / before
                scales.append(scaler.get_scale())
            recorded[name, n], recorded[name, n, "scales"] = steps, scales
    for n in (4, 40):
        assert [ops.count("aten._local_scalar_dense.default") for ops in recorded["ours", n]] \
            == [ops.count("aten._local_scalar_dense.default") for ops in recorded["torch", n]] \
            == [1] * len(values)
    assert recorded["ours", 4] == recorded["ours", 40]
    assert recorded["ours", 40, "scales"] == recorded["torch", 40, "scales"] == [4, 8, 4, 4, 2, 2]
    assert len(recorded["ours", 40][0]) <= len(recorded["torch", 40][0])  # a clean step


@pytest.mark.parametrize("hyper", HYPERS[1:4], ids=str)
def test_load_state_dict_continues_a_grad_scalers_sequence(hyper):
    stream = gradient_stream(30, seed=1)
    theirs = torch.amp.GradScaler("cpu", **hyper)
    q = torch.ones(4, requires_grad=True)
    opt_q = torch.optim.SGD([q], lr=0.1)
    for g in stream[:15]:
        scaled_step(theirs, opt_q, q, g)
    ours = LossScaler()
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict() == theirs.state_dict()
    p = q.detach().clone().requires_grad_()
    opt_p = torch.optim.SGD([p], lr=0.1)
    for g in stream[15:]:
        scaled_step(ours, opt_p, p, g)
        scaled_step(theirs, opt_q, q, g)
        assert ours.get_scale() == theirs.get_scale() and torch.equal(p, q)
    again = torch.amp.GradScaler("cpu")  # and back into a GradScaler
    again.load_state_dict(ours.state_dict())
    assert again.state_dict() == ours.state_dict() == theirs.state_dict()


@pytest.mark.parametrize("bad", [dict(growth_factor=1.0), dict(growth_factor=0.5),
                                 dict(backoff_factor=0.0), dict(backoff_factor=1.0),
                                 dict(backoff_factor=1.5), dict(growth_interval=0)], ids=str)
def test_invalid_hyperparameters_raise(bad):
    with pytest.raises(ValueError):
        LossScaler(**bad)


def test_loss_scaler_unscales_fp16_gradients_which_grad_scaler_refuses():
    """fp16 parameters, an fp32 loss (the scale's gradient, S itself, would overflow fp16)."""
    g = torch.tensor([2.0**-20, -3 * 2.0**-18, 1e-5, 3e-4], dtype=torch.float16)
    for hyper in (dict(init_scale=2.0**25), dict(init_scale=1000.0 * 1.5**3)):
        p = torch.zeros(4, dtype=torch.float16, requires_grad=True)
        opt = torch.optim.SGD([p], lr=1.0)
        theirs = torch.amp.GradScaler("cpu", **hyper)
        theirs.scale((p.float() * g).sum()).backward()
        with pytest.raises(ValueError, match="FP16"):
            theirs.unscale_(opt)
        p.grad = None
        ours = LossScaler(**hyper)
        ours.scale((p.float() * g).sum()).backward()
        assert torch.isfinite(p.grad).all()
        scaled = p.grad.clone()
        ours.unscale_(opt)
        # the product in fp32, rounded once to fp16: at a scale of 2^25 the inverse scale
        # (2^-25) is below fp16's smallest number, yet the unscaled gradients are not zero
        inv = torch.tensor(hyper["init_scale"]).double().reciprocal().float()
        assert torch.equal(p.grad, (scaled.float() * inv).half())
        if hyper["init_scale"] == 2.0**25:
            assert torch.equal(p.grad, g)
        ours.step(opt)
        assert not ours.skipped and torch.equal(p.detach(), -p.grad)
        ours.update()
    p = torch.zeros(2, dtype=torch.float16, requires_grad=True)
    opt = torch.optim.SGD([p], lr=1.0)
    ours = LossScaler()  # 2^16: a gradient of 1 overflows fp16 once scaled
    ours.scale((p.float() * torch.tensor([1.0, 1e-3])).sum()).backward()
    assert torch.isinf(p.grad[0])
    ours.step(opt)
    assert ours.skipped and torch.equal(p.detach(), torch.zeros(2, dtype=torch.float16))
    ours.update()
    assert ours.get_scale() == 2.0**15


def test_scale_of_an_fp16_loss_is_grad_scalers():
    """The scale (2^16 by default) is not representable in fp16; multiplying by it must not
    round it to fp16 (inf) first."""
    loss = torch.tensor(0.5, dtype=torch.float16)
    for batch in (loss, loss.reshape(1)):
        ours, theirs = LossScaler().scale(batch), torch.amp.GradScaler("cpu").scale(batch)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
        assert torch.isfinite(ours).all() and ours.float().sum().item() == 2.0**15


# -- MasterWeights ---------------------------------------------------------------------------


def test_fp16_weights_move_under_updates_below_half_an_ulp_only_with_masters():
    """Near 1 fp16's numbers are 2^-10 apart (2^-11 below 1); a step of lr * grad = 1e-4 is
    less than half of either: plain fp16 SGD rounds every update away."""
    g = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float16)
    plain = torch.ones(3, dtype=torch.float16, requires_grad=True)
    mixed = torch.ones(3, dtype=torch.float16, requires_grad=True)
    plain_opt = torch.optim.SGD([plain], lr=1e-4)
    master_opt = MasterWeights([mixed], torch.optim.SGD, lr=1e-4)
    for _ in range(30):
        for t, opt in ((plain, plain_opt), (mixed, master_opt)):
            opt.zero_grad()
            (t * g).sum().backward()
            opt.step()
    assert torch.equal(plain.detach(), torch.ones(3, dtype=torch.float16))
    master = master_opt.masters[0]
    assert master.dtype == torch.float32
    torch.testing.assert_close(master.detach(), 1 - 30 * 1e-4 * g.float(), rtol=0, atol=1e-6)
    assert torch.equal(mixed.detach(), master.detach().half())
    assert (mixed.detach() != 1).all()


def mlp(dtype=torch.float32, seed=0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)


def batch(step: int, rank: int = 0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(8, 5, generator=generator).to(dtype),
            torch.randn(8, 3, generator=generator).to(dtype))


def mse(model: nn.Module, x, y) -> torch.Tensor:
    return ((model(x).float() - y.float()) ** 2).mean()


@pytest.mark.parametrize("optimizer, hyper", [
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
])
def test_master_weights_over_fp32_parameters_is_the_inner_optimizer(optimizer, hyper):
    a, b = mlp(), mlp()
    ours, theirs = MasterWeights(a.parameters(), optimizer, **hyper), optimizer(b.parameters(),
                                                                                **hyper)
    for step in range(5):
        for model, opt in ((a, ours), (b, theirs)):
            opt.zero_grad()
            mse(model, *batch(step)).backward()
            opt.step()
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa, pb)
    assert all(p.grad is None for p in a.parameters())  # moved to the masters


def test_gradients_accumulate_in_fp32_over_backward_passes_and_zero_grad_clears_them():
    model = mlp(torch.float16)
    opt = MasterWeights(model.parameters(), torch.optim.SGD, lr=0.1)
    reference = mlp(torch.float16)
    want = []
    for step in (0, 1):
        reference.zero_grad()
        mse(reference, *batch(step, dtype=torch.float16)).backward()
        want.append([p.grad.float() for p in reference.parameters()])
    for step in (0, 1):
        mse(model, *batch(step, dtype=torch.float16)).backward()
    for p, master, g0, g1 in zip(model.parameters(), opt.masters, *want):
        assert p.grad is None and master.grad.dtype == torch.float32
        assert torch.equal(master.grad, g0 + g1)
    opt.zero_grad()
    assert all(m.grad is None for m in opt.masters)
    mse(model, *batch(0, dtype=torch.float16)).backward()
    for master, g0 in zip(opt.masters, want[0]):
        assert torch.equal(master.grad, g0)  # a fresh sum, not added to the old one


def test_master_weights_state_dict_round_trip():
    def run(model, opt, steps):
        for step in steps:
            opt.zero_grad()
            mse(model, *batch(step, dtype=torch.float16)).backward()
            opt.step()

    a = mlp(torch.float16)
    opt_a = MasterWeights(a.parameters(), torch.optim.AdamW, lr=1e-2)
    run(a, opt_a, range(3))
    saved = copy.deepcopy(opt_a.state_dict())  # as torch.save would: torch's optimizers'
    # state dicts hold their live state tensors, which load_state_dict would share
    b = mlp(torch.float16, seed=1)
    opt_b = MasterWeights(b.parameters(), torch.optim.AdamW, lr=1e-2)
    opt_b.load_state_dict(saved)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    run(a, opt_a, range(3, 6))
    run(b, opt_b, range(3, 6))
    for pa, pb, ma, mb in zip(a.parameters(), b.parameters(), opt_a.masters, opt_b.masters):
        assert torch.equal(pa, pb) and torch.equal(ma, mb)
    assert opt_b.state[opt_b.masters[0]]["step"].item() == 6


def test_loss_scaler_and_grad_scaler_agree_on_master_weights():
    """GradScaler works on MasterWeights: it sees the fp32 gradients of the masters."""
    a, b = mlp(torch.float16), mlp(torch.float16)
    opt_a = MasterWeights(a.parameters(), torch.optim.SGD, lr=0.05, momentum=0.9)
    opt_b = MasterWeights(b.parameters(), torch.optim.SGD, lr=0.05, momentum=0.9)
    hyper = dict(init_scale=2.0**12, growth_interval=2)
    ours, theirs = LossScaler(**hyper), torch.amp.GradScaler("cpu", **hyper)
    skipped, scales = 0, []
    for step in range(12):
        x, y = batch(step, dtype=torch.float16)
        if step % 4 == 3:
            x[0, 0] = INF  # an overflow in the forward: every step of these is skipped
        for model, opt, scaler in ((a, opt_a, ours), (b, opt_b, theirs)):
            opt.zero_grad()
            scaler.scale(mse(model, x, y)).backward()
            scaler.step(opt)
            if scaler is ours:
                skipped += ours.skipped
            scaler.update()
        assert ours.get_scale() == theirs.get_scale()
        scales.append(ours.get_scale())
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa, pb)
    assert skipped == 3 and scales == [2.0**12, 2.0**13, 2.0**13, 2.0**12] * 3
    assert not torch.equal(a[0].weight, mlp(torch.float16)[0].weight)


# -- DistributedLossScaler ---------------------------------------------------------------------


def scaled_sgd_ranks(comm, distributed: bool, steps: int):
    """Each rank its own gradients; at step k rank k % world_size alone has a nan. Returns the
    rank's (skipped steps, scales, parameters)."""
    p = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    hyper = dict(init_scale=2.0**8, growth_interval=1)
    scaler = DistributedLossScaler(comm, **hyper) if distributed else LossScaler(**hyper)
    skipped, scales = [], []
    for step in range(steps):
        g = torch.randn(3, generator=torch.Generator().manual_seed(10 * step + comm.rank))
        if step % 2 == 1 and comm.rank == (step // 2) % comm.world_size:
            g[1] = NAN
        opt.zero_grad()
        scaler.scale((p * g).sum()).backward()
        scaler.step(opt)
        skipped.append(scaler.skipped)
        scaler.update()
        scales.append(scaler.get_scale())
    return skipped, scales, p.detach()


@pytest.mark.parametrize("n", RANKS)
def test_a_nan_on_one_rank_makes_every_rank_skip(n):
    results = SimulatedWorld(n).run(scaled_sgd_ranks, True, 8)
    want = [step % 2 == 1 for step in range(8)]
    for skipped, scales, _ in results:
        assert skipped == want
        assert scales == results[0][1]
    assert results[0][1][:2] == [2.0**9, 2.0**8]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_plain_loss_scalers_on_the_same_stream_disagree(n):
    results = SimulatedWorld(n).run(scaled_sgd_ranks, False, 8)
    decisions = [skipped for skipped, _, _ in results]
    assert len({tuple(d) for d in decisions}) > 1
    assert any(s != results[0][1] for _, s, _ in results[1:])
    assert results[0][0][1] and not results[1][0][1]  # step 1: rank 0's nan, rank 1 stepped


# -- ZeroOptimizer -----------------------------------------------------------------------------


def zero_model(dtype=F64) -> nn.Module:
    """57 parameters: padded to 58 on 2 ranks, 60 on 4; none on 1 and 3."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)


ADAMW = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)


def zero_ranks(comm, model, steps, optimizer=torch.optim.AdamW, hyper=ADAMW):
    model = copy.deepcopy(model)
    zero = ZeroOptimizer(model.parameters(), comm, optimizer, **hyper)
    for step in range(steps):
        zero.zero_grad()
        mse(model, *batch(step, comm.rank, next(model.parameters()).dtype)).backward()
        zero.step()
    return [p.detach().clone() for p in model.parameters()], zero.state_bytes(), zero.shard_size


def unsharded(model, n, steps, hyper=ADAMW, skipped=()):
    """AdamW on the whole model, stepped on the average of the n ranks' gradients (except at
    the steps `skipped`)."""
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), **hyper)
    for step in (s for s in range(steps) if s not in skipped):
        grads = []
        for rank in range(n):
            model.zero_grad()
            mse(model, *batch(step, rank, F64)).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = torch.stack(gs).mean(0)
        opt.step()
    return model, opt


@pytest.mark.parametrize("n", RANKS)
def test_zero_equals_unsharded_adamw_on_the_average_gradient(n):
    base = zero_model()
    results = SimulatedWorld(n).run(zero_ranks, base, 4)
    want, opt = unsharded(base, n, 4)
    numel = sum(p.numel() for p in base.parameters())
    padded = -(-numel // n) * n
    assert (padded - numel) == {1: 0, 2: 1, 3: 0, 4: 3}[n]
    for params, state, shard in results:
        assert shard == padded // n
        for got, p in zip(params, want.parameters()):
            torch.testing.assert_close(got, p.detach(), rtol=0, atol=1e-12)
        assert not torch.equal(params[0], base[0].weight)  # it did train
        # this rank's moments, 2 float64 numbers per element of its shard, and one step count
        assert state == 2 * 8 * shard + 4
    whole = optimizer_state_bytes(opt)
    assert whole == 2 * 8 * numel + 4 * len(list(base.parameters()))
    per_rank = results[0][1]
    # 1/N of the unsharded state, give or take the padding and the per-tensor step counts
    assert abs(per_rank - whole / n) <= 16 * (padded - numel) / n + 4 * 4
    assert sum(r[1] for r in results) - 4 * n == 16 * padded


@pytest.mark.parametrize("n", RANKS)
def test_zero_step_is_one_reduce_scatter_and_one_all_gather(n):
    base = zero_model()
    world = SimulatedWorld(n)
    steps = 3
    world.run(zero_ranks, base, steps)
    numel = sum(p.numel() for p in base.parameters())
    padded = -(-numel // n) * n
    summary = world.trace.summary()
    for rank in range(n):
        collectives = [e.kind for e in world.trace.of_rank(rank)
                       if e.kind not in ("send", "recv", "compute")]
        assert collectives == ["reduce_scatter", "all_gather"] * steps
        sent = summary[rank].sent_bytes if rank in summary else 0
        assert sent == steps * 2 * (n - 1) * padded * 8 // n
        # the memory module's traffic per parameter, times the padded parameters
        assert sent == pytest.approx(steps * zero_traffic_per_rank(1, n, gradient_bytes=8)
                                     * padded)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [2, 3])
def test_half_precision_parameters_get_fp32_master_shards(n, dtype):
    base = zero_model(dtype)

    def body(comm):
        model = copy.deepcopy(base)
        zero = ZeroOptimizer(model.parameters(), comm, torch.optim.AdamW, lr=1e-3)
        assert zero.shard.dtype == torch.float32
        for step in range(3):
            zero.zero_grad()
            mse(model, *batch(step, comm.rank, dtype)).backward()
            zero.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        start = comm.rank * zero.shard_size
        mine = flat[start:start + zero.shard_size]
        assert torch.equal(mine, zero.shard.detach()[:mine.numel()].to(dtype))
        # master (4 bytes) and two fp32 moments (8) per element of the shard, one step count
        assert zero.state_bytes() == 12 * zero.shard_size + 4
        return flat, zero.shard.detach().clone()

    world = SimulatedWorld(n)
    results = world.run(body)
    masters = torch.cat([shard for _, shard in results])[:results[0][0].numel()]
    for flat, _ in results:
        assert torch.equal(flat, masters.to(dtype))  # every rank has every parameter
    numel, shard = results[0][0].numel(), results[0][1].numel()
    gathered = [e for e in world.trace.of_rank(0) if e.kind == "all_gather"]
    assert len(gathered) == 3 and all(e.nbytes == 2 * shard for e in gathered)  # in 16 bits
    assert numel <= shard * n


def zero_scaled_ranks(comm, model, distributed: bool, nan_steps: set[int], steps: int):
    """ZeRO with a loss scaler: at each step of `nan_steps` rank 0's gradient of the first
    weight alone is nan (only the rank whose shard holds it sees it after the reduce-scatter)."""
    model = copy.deepcopy(model)
    zero = ZeroOptimizer(model.parameters(), comm, torch.optim.AdamW, **ADAMW)
    hyper = dict(init_scale=2.0**10, growth_interval=1)
    scaler = DistributedLossScaler(comm, **hyper) if distributed else LossScaler(**hyper)
    skipped, scales = [], []
    for step in range(steps):
        zero.zero_grad()
        scaler.scale(mse(model, *batch(step, comm.rank, F64))).backward()
        if step in nan_steps and comm.rank == 0:
            model[0].weight.grad[0, 0] = NAN
        zero.reduce_gradients()
        scaler.step(zero)
        skipped.append(scaler.skipped)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().clone() for p in model.parameters()], skipped, scales


@pytest.mark.parametrize("n", RANKS)
def test_zero_with_distributed_scaler_skips_on_every_rank(n):
    base = zero_model()
    results = SimulatedWorld(n).run(zero_scaled_ranks, base, True, {1}, 4)
    # the reference: unsharded AdamW on the average gradient, step 1 skipped
    model, _ = unsharded(base, n, 4, skipped={1})
    for params, skipped, scales in results:
        assert skipped == [False, True, False, False]
        assert scales == [2.0**11, 2.0**10, 2.0**11, 2.0**12]
        for got, p in zip(params, model.parameters()):
            torch.testing.assert_close(got, p.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_zero_with_plain_scalers_fails_naming_a_rank_instead_of_hanging(n):
    """Rank 0 alone finds the nan in its shard and skips; the others step and wait in the
    all-gather for a rank that has returned: the world reports it at once."""
    with pytest.raises(RankFailure) as failure:
        SimulatedWorld(n, timeout=5).run(zero_scaled_ranks, zero_model(), False, {1}, 2)
    assert failure.value.ranks and 0 not in failure.value.ranks
    assert set(failure.value.ranks) == set(range(1, n))
    assert "rank 0" in str(failure.value) and "all_gather" in str(failure.value)


def test_zero_rejects_an_empty_parameter_list():
    comm = SimulatedWorld(1).communicators()[0]
    with pytest.raises(ValueError):
        ZeroOptimizer([], comm, torch.optim.AdamW)
    with pytest.raises(ValueError):
        ZeroOptimizer([torch.zeros(3)], comm, torch.optim.AdamW)  # none requires a gradient


# -- memory ------------------------------------------------------------------------------------


def test_bytes_per_parameter_is_16_with_and_without_mixed_precision():
    fp32, mixed = bytes_per_parameter(False), bytes_per_parameter(True)
    assert (fp32.parameter, fp32.gradient, fp32.optimizer_state, fp32.total) == (4, 4, 8, 16)
    assert (mixed.parameter, mixed.gradient, mixed.optimizer_state, mixed.total) == (2, 2, 12, 16)
    assert bytes_per_parameter(True, moments=1).total == 12  # SGD with momentum
    assert bytes_per_parameter(False, moments=0).total == 8


def test_zero_bytes_per_rank_by_stage_are_the_zero_papers():
    """The ZeRO paper's example: 7.5 B parameters on 64 ranks need 120, 31.4, 16.6 and
    1.9 GB per rank under stages 0 to 3."""
    gb = [zero_bytes_per_rank(stage, 64).total * 7.5 for stage in range(4)]
    assert [round(x, 1) for x in gb] == [120.0, 31.4, 16.6, 1.9]
    n = 4
    rows = [zero_bytes_per_rank(stage, n) for stage in range(4)]
    assert [(r.parameter, r.gradient, r.optimizer_state) for r in rows] == [
        (2, 2, 12), (2, 2, 3), (2, 0.5, 3), (0.5, 0.5, 3)]
    assert zero_bytes_per_rank(3, n, mixed=False).total == 16 / n
    assert zero_bytes_per_rank(2, 1).total == 16  # one rank: nothing to shard
    for stage in (-1, 4):
        with pytest.raises(ValueError):
            zero_bytes_per_rank(stage, n)


def test_zero_traffic_is_a_ring_all_reduces_up_to_stage_2():
    def ring_all_reduce(comm):
        ring(comm, torch.zeros(1200))

    for n in (2, 3, 4):
        world = SimulatedWorld(n)
        world.run(ring_all_reduce)
        sent = world.trace.summary()[0].sent_bytes
        assert sent == pytest.approx(zero_traffic_per_rank(0, n, gradient_bytes=4) * 1200)
        for stage in (1, 2):
            assert zero_traffic_per_rank(stage, n) == zero_traffic_per_rank(0, n)
        assert zero_traffic_per_rank(3, n) == pytest.approx(1.5 * zero_traffic_per_rank(0, n))
        assert zero_traffic_per_rank(0, n) == pytest.approx(2 * 2 * (n - 1) / n)
    assert zero_traffic_per_rank(1, 1) == 0
    for stage in (-1, 4):
        with pytest.raises(ValueError):
            zero_traffic_per_rank(stage, 4)
