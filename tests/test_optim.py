"""The optimizer extension point, lib_dist.optim.Optimizer, and the instructor's SGD and AdamW
(loaded from solutions/lab02_training) against torch.optim, step for step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lab_solutions import solution
from tolerances import tolerance

from lib_dist.models import MLP
from lib_dist.optim import Optimizer, param_groups

SGD, AdamW = solution("lab02_training", "SGD", "AdamW")


class SignSGD(Optimizer):
    """The example of the contract."""

    def __init__(self, params, lr=0.01):
        super().__init__(params, lr=lr)

    def update(self, p, grad, state, group):
        state.setdefault("seen", []).append(state["step"])
        p.add_(grad.sign(), alpha=-group["lr"])


def test_update_is_called_per_parameter_with_its_state_and_group():
    a = torch.tensor([1.0, -2.0], requires_grad=True)
    b = torch.tensor([3.0], requires_grad=True)
    unused = torch.tensor([5.0], requires_grad=True)
    opt = SignSGD([{"params": [a]}, {"params": [b, unused], "lr": 0.5}], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (a ** 2).sum().add(b.sum()).backward()
        opt.step()
    assert torch.allclose(a, torch.tensor([0.8, -1.8]))
    assert torch.allclose(b, torch.tensor([2.0]))
    assert opt.state[a]["seen"] == [1, 2] and opt.state[b]["step"] == 2
    assert unused not in opt.state and unused.item() == 5.0  # no gradient: skipped


def test_state_dict_round_trip_and_torch_schedulers():
    p = torch.nn.Parameter(torch.ones(3))
    opt = SignSGD([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    other = SignSGD([p], lr=0.9)
    other.load_state_dict(opt.state_dict())
    assert other.state[p]["step"] == 1 and other.param_groups[0]["lr"] == 0.1
    scheduler = torch.optim.lr_scheduler.LambdaLR(other, lambda epoch: 0.5)
    assert other.param_groups[0]["lr"] == pytest.approx(0.05)
    other.step()
    scheduler.step()
    assert torch.allclose(p.detach(), torch.full((3,), 1 - 0.1 - 0.05))


def test_closure_and_contract_errors():
    p = torch.nn.Parameter(torch.ones(1))
    opt = SignSGD([p])
    assert opt.step(lambda: torch.tensor(7.0)).item() == 7.0

    class NoLr(Optimizer):
        def __init__(self, params):
            super().__init__(params, momentum=0.9)

    class NoUpdate(Optimizer):
        def __init__(self, params):
            super().__init__(params, lr=0.1)

    with pytest.raises(TypeError, match="learning rate"):
        NoLr([p])
    with pytest.raises(ValueError, match="lr must be >= 0"):
        SignSGD([p], lr=-1.0)
    p.grad = torch.ones(1)
    with pytest.raises(NotImplementedError, match="NoUpdate must implement update"):
        NoUpdate([p]).step()


def test_param_groups_split_matrices_from_vectors():
    model = MLP(4, [8], 2)
    decay, no_decay = param_groups(model, weight_decay=0.1)
    assert [p.dim() for p in decay["params"]] == [2, 2] and decay["weight_decay"] == 0.1
    assert [p.dim() for p in no_decay["params"]] == [1, 1] and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def final_parameters(make_optimizer, steps=20, groups=False):
    torch.manual_seed(0)
    model = MLP(8, [16], 3).double()
    gen = torch.Generator().manual_seed(1)
    opt = make_optimizer(param_groups(model, 0.05) if groups else model.parameters())
    for _ in range(steps):
        x = torch.randn(10, 8, dtype=torch.float64, generator=gen)
        y = torch.randint(3, (10,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


CASES = [
    ("SGD", lambda ps: SGD(ps, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1), False),
    ("SGD momentum+wd", lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01), True),
    ("AdamW", lambda ps: AdamW(ps, lr=1e-2), lambda ps: torch.optim.AdamW(ps, lr=1e-2), False),
    ("AdamW eps, betas, wd", lambda ps: AdamW(ps, lr=0.05, betas=(0.5, 0.9), eps=0.1,
                                              weight_decay=1.0),
     lambda ps: torch.optim.AdamW(ps, lr=0.05, betas=(0.5, 0.9), eps=0.1, weight_decay=1.0),
     True),
]


@pytest.mark.parametrize("name, ours, theirs, groups", CASES, ids=[c[0] for c in CASES])
def test_instructor_optimizers_equal_torch_after_20_steps(name, ours, theirs, groups):
    start = final_parameters(ours, steps=0)
    mine, expected = final_parameters(ours, groups=groups), final_parameters(theirs, groups=groups)
    assert (mine - start).abs().max() > 1e-3  # it did train
    # each of the 20 steps rounds the update a few times, relative to the parameters
    assert (mine - expected).abs().max() <= 20 * tolerance(torch.float64, expected.abs().max())


def test_adam_with_l2_is_not_adamw():
    """The distinction lab 2 teaches: torch's Adam(weight_decay) differs from AdamW."""
    adam_l2 = final_parameters(lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.5))
    adamw = final_parameters(lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.5))
    assert (adam_l2 - adamw).abs().max() > 1e-3
