"""lib_dist.horovod on 4 real ranks (one cluster for the module): object operations,
broadcasting a model's parameters and an optimizer's state, and the gradients of the
collectives (allreduce, allgather, broadcast are differentiable, as Horovod defines them).

Every function below runs on each rank with `hvd.init()` first (a no-op once initialized).
"""

from __future__ import annotations

import pytest
import torch

from lib_dist.cluster import Cluster

pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster]
N = 4


@pytest.fixture(scope="module")
def cluster():
    with Cluster(N, timeout=30) as c:
        yield c


def objects_and_models(comm):
    import torch

    import lib_dist.horovod as hvd

    hvd.init()
    r = hvd.rank()
    out = dict(obj=hvd.broadcast_object({"from": r, "f": lambda x: x + r}, root_rank=2),
               objs=hvd.allgather_object("x" * r))
    out["f"] = out["obj"].pop("f")(10)
    torch.manual_seed(r)  # a different model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model(torch.randn(5, 3))  # running statistics differ too
    hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    out["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    other = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(other.weight, float(r))
    hvd.broadcast_parameters(other.named_parameters(), root_rank=3)  # (name, tensor) pairs
    hvd.broadcast_parameters([other.bias], root_rank=0)  # plain tensors
    out["other"] = (other.weight.detach().clone(), other.bias.detach().clone())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    before = [p.detach().clone() for p in model.parameters()]
    if r != 0:  # state on these ranks only; rank 0 has not stepped
        model(torch.randn(5, 3)).sum().backward()
        optimizer.step()
        before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    # rank 0 stepped once on zero gradients (Horovod's way to make the state), which Adam's
    # update of 0 / (sqrt(0) + eps) leaves the parameters alone
    out["first"] = ({k: v["step"].item() for k, v in optimizer.state.items()},
                    optimizer.param_groups[0]["lr"],
                    all(torch.equal(p, b) for p, b in zip(model.parameters(), before)),
                    [float(v["exp_avg"].abs().sum()) for v in optimizer.state.values()])
    for _ in range(r + 1):  # now different states everywhere
        model(torch.randn(5, 3)).sum().backward()
        optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=2)
    out["optimizer"] = optimizer.state_dict()
    try:
        hvd.broadcast_parameters(3, root_rank=0)
    except ValueError as e:
        out["bad"] = str(e)
    return out


def test_objects_parameters_and_optimizer_state(cluster):
    results = cluster.run(objects_and_models)
    for r, got in enumerate(results):
        assert got["obj"] == {"from": 2} and got["f"] == 12  # a lambda travels (cloudpickle)
        assert got["objs"] == ["", "x", "xx", "xxx"]
        for name, value in got["state"].items():
            assert torch.equal(value, results[1]["state"][name]), name
        assert got["other"][0].eq(3.0).all()
        assert torch.equal(got["other"][1], results[0]["other"][1])
        steps, lr, unchanged, moments = got["first"]
        assert steps == {p: 1.0 for p in steps} and len(steps) == 4 and lr == 0.01
        assert moments == [0.0] * 4  # rank 0's state, from its step on zero gradients
        assert unchanged or r != 0
        state = got["optimizer"]["state"]
        root = results[2]["optimizer"]["state"]
        assert state.keys() == root.keys() and len(state) == 4
        for index, slots in state.items():
            assert slots["step"].item() == 4.0  # rank 2 stepped three times after the first
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(slots[key], root[index][key])
        assert "dict (model.state_dict()) or a list" in got["bad"]


def gradients(comm):
    import torch

    import lib_dist.horovod as hvd

    hvd.init()
    r = hvd.rank()
    out = {}
    x = torch.full((2,), float(r + 1), requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * torch.tensor([1.0, 2.0])).sum().backward()
    out["sum"] = x.grad
    x = torch.full((2,), float(r + 1), requires_grad=True)
    hvd.allreduce(x).sum().backward()  # Average
    out["average"] = x.grad
    rows = torch.ones(r + 1, 2, requires_grad=True)
    weights = torch.arange(20.0).reshape(10, 2)
    (hvd.allgather(rows) * weights).sum().backward()
    out["gather"] = rows.grad
    y = torch.ones(3, requires_grad=True)
    (hvd.broadcast(y, root_rank=1) * (r + 1)).sum().backward()
    out["broadcast"] = y.grad
    return out


def test_collectives_are_differentiable(cluster):
    weights = torch.arange(20.0).reshape(10, 2)
    for r, got in enumerate(cluster.run(gradients)):
        # Horovod's rules: allreduce's gradient is all-reduced the same way; allgather's and
        # broadcast's are averaged over the ranks (broadcast's kept on the root only)
        assert got["sum"].tolist() == [4.0, 8.0]
        assert got["average"].tolist() == [1.0, 1.0]  # 4 ranks x 1/4
        first = r * (r + 1) // 2
        assert torch.equal(got["gather"], weights[first: first + r + 1])  # 4 ranks' / 4
        # (1 + 2 + 3 + 4) / 4 on the root
        assert got["broadcast"].tolist() == ([2.5] * 3 if r == 1 else [0.0] * 3)
