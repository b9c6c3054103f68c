"""lib_dist on a CUDA machine, checked in a few minutes: one table of what, result, and
pass / fail / skip (`make gpu-check`; CI has no GPU: run it wherever one can be had).

- cuda first: this process uses CUDA, then starts a `Cluster(1, device="cuda")` (on cuda:0),
  which the next three rows share;
- NCCL: that rank's group is NCCL, and all_reduce, broadcast, all_gather and reduce_scatter of
  tensors on the GPU give what one rank must;
- DataParallel: module 02's GPT wrapped in `DataParallel` on the GPU rank has the gradients of
  the same model in this process, on the same GPU and batch;
- ZeroOptimizer: 3 AdamW steps of ZeRO-1 on the GPU rank leave a plain AdamW's parameters;
- fallback: `Cluster(2)` on a machine with fewer than 2 GPUs puts both ranks on the CPU, gloo;
- refuses: `Cluster(N + 1, device="cuda")` on N GPUs raises at once, naming the numbers;
- launcher: `python -m lib_dist.run -np 1 --device cuda` runs a script whose `hvd.allreduce`
  of a GPU tensor goes through NCCL;
- activations: module 02's formula (`gpt_activation_bytes`) against the bytes CUDA's allocator
  holds after a forward pass of the GPT in fp32;
- LossScaler: its whole fp16 step against GradScaler's (goal: at most 1.05 times), and the
  scalers alone on 52 and 292 gradients (benchmarks/scaler_rounds.py);
- module 9 (benchmarks/gpu_rows_sharding.py): ZeRO-2 and FSDP with prefetch on the GPU rank
  against plain AdamW (and FSDP2), and full and selective recomputation on CUDA.

Without CUDA the rows that need it are skipped, each saying so, and the others run (the fallback
and refusal rows). A row that needs a cluster is skipped where ipyparallel is missing (on a
machine without it, carry its wheels: benchmarks/README.md). Exits with 1 when a row failed,
after printing each failure's traceback in full; else 0.

    python benchmarks/gpu_check.py [--only ROW ...] [--rounds 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import cloudpickle
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # lib_dist, and the rows beside this

from gpu_rows import (CHECKS, Skip, assert_adamw_close, backend_and_device, batch, check, gpus,
                      needs_cluster, small_gpt)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the engines cannot import this


@check("cuda first", "a process that used CUDA starts Cluster(1, device='cuda')")
def cuda_first(args: argparse.Namespace, shared: dict) -> str:
    from lib_dist.cluster import Cluster
    torch.ones(1, device="cuda").sum().item()
    assert torch.cuda.is_initialized()
    start = time.perf_counter()
    shared["cluster"] = Cluster(1, device="cuda").start()
    [(backend, device)] = shared["cluster"].run(backend_and_device)
    assert device == "cuda:0", f"the engine's device is {device}"
    return f"engine on {device} ({backend}), started in {time.perf_counter() - start:.1f} s"


def collectives(comm: Any) -> dict[str, bool]:
    t = torch.arange(6.0, device=comm.device)
    out = {"device": t.is_cuda, "all_reduce": torch.equal(comm.all_reduce(t.clone()), t),
           "broadcast": torch.equal(comm.broadcast(t.clone()), t),
           "all_gather": all(torch.equal(x, t) for x in comm.all_gather(t.clone())),
           "reduce_scatter": torch.equal(comm.reduce_scatter(t.clone()), t)}
    return {**out, "nccl": comm.backend == "nccl"}


@check("NCCL", "Cluster(1, device='cuda'): NCCL, and its collectives on GPU tensors")
def nccl(args: argparse.Namespace, shared: dict) -> str:
    [ok] = needs_cluster(shared).run(collectives)
    assert all(ok.values()), f"failed: {[k for k, v in ok.items() if not v]}"
    return "nccl; all_reduce, broadcast, all_gather, reduce_scatter exact"


def dp_gradients(comm: Any) -> list[torch.Tensor]:
    from lib_dist.data_parallel import DataParallel
    model = DataParallel(small_gpt(str(comm.device)), comm)
    x, y = batch(str(comm.device))
    F.cross_entropy(model(x).reshape(-1, 96), y.reshape(-1)).backward()
    return [p.grad.cpu() for p in model.module.parameters() if p.grad is not None]


@check("DataParallel", "DataParallel on the GPU rank: one process's gradients")
def data_parallel(args: argparse.Namespace, shared: dict) -> str:
    [theirs] = needs_cluster(shared).run(dp_gradients)
    model = small_gpt("cuda")
    x, y = batch("cuda")
    F.cross_entropy(model(x).reshape(-1, 96), y.reshape(-1)).backward()
    mine = [p.grad.cpu() for p in model.parameters() if p.grad is not None]
    assert len(mine) == len(theirs), f"{len(theirs)} gradients, one process has {len(mine)}"
    # one rank averages one gradient: the same, up to the order of a GPU's sums over the
    # batch's 512 positions (each rounding within eps relative to the largest term)
    eps = torch.finfo(torch.float32).eps
    for a, b in zip(mine, theirs):
        assert (a - b).abs().max() <= 512 * eps * b.abs().max(), "a gradient differs"
    same = sum(torch.equal(a, b) for a, b in zip(mine, theirs))
    return f"{len(mine)} gradients agree ({same} bit for bit)"


def zero_steps(comm: Any, steps: int = 3) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    from lib_dist.mixed_precision import ZeroOptimizer
    out = []
    for sharded in (True, False):
        model = small_gpt(str(comm.device))
        opt: Any = (ZeroOptimizer(model.parameters(), comm, torch.optim.AdamW, lr=1e-2)
                    if sharded else torch.optim.AdamW(model.parameters(), lr=1e-2))
        for k in range(steps):
            opt.zero_grad()
            x, y = batch(str(comm.device), rows=2 + k)
            F.cross_entropy(model(x).reshape(-1, 96), y.reshape(-1)).backward()
            opt.step()
        out.append([p.detach().cpu() for p in model.parameters()])
    return out[0], out[1]


@check("ZeroOptimizer", "ZeroOptimizer on the GPU rank: a plain AdamW's parameters")
def zero(args: argparse.Namespace, shared: dict) -> str:
    [(sharded, plain)] = needs_cluster(shared).run(zero_steps)
    # one flat shard against per-tensor AdamW (zero_steps: 3 steps of lr 1e-2)
    same = assert_adamw_close(dict(enumerate(sharded)), dict(enumerate(plain)), 3, 1e-2)
    return f"3 steps: {len(plain)} parameters agree ({same} bit for bit)"


@check("fallback", "Cluster(2) with fewer than 2 GPUs: both ranks on the CPU, gloo", cuda=False)
def fallback(args: argparse.Namespace, shared: dict) -> str:
    from lib_dist.cluster import Cluster
    if gpus() >= 2:
        raise Skip(f"{gpus()} GPUs here: Cluster(2) gets one each")
    with Cluster(2) as cluster:
        ranks = cluster.run(backend_and_device)
    assert ranks == [("gloo", "cpu")] * 2, ranks
    return f"{gpus()} GPU{'' if gpus() == 1 else 's'}: both ranks gloo on cpu"


@check("refuses", "Cluster(N + 1, device='cuda') on N GPUs refuses, clearly", cuda=False,
       cluster=False)
def refuses(args: argparse.Namespace, shared: dict) -> str:
    from lib_dist.cluster import Cluster
    n = gpus() + 1
    try:
        Cluster(n, device="cuda")
    except ValueError as e:
        assert f"{n} GPU ranks" in str(e) and f"{gpus()} GPU" in str(e), str(e)
        return f"ValueError: {e}"
    raise AssertionError(f"Cluster({n}, device='cuda') was accepted on {gpus()} GPUs")


SCRIPT = """import torch, lib_dist.horovod as hvd, lib_dist.horovod.basics as basics
hvd.init()
t = hvd.allreduce(torch.ones(3, device=f"cuda:{hvd.local_rank()}"), average=False)
print("backend", basics.state().comm.backend, "device", t.device, "sum", t.sum().item())
"""


@check("launcher", "python -m lib_dist.run -np 1 --device cuda: hvd.allreduce on NCCL")
def launcher(args: argparse.Namespace, shared: dict) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "on_gpu.py"
        script.write_text(SCRIPT)
        done = subprocess.run([sys.executable, "-m", "lib_dist.run", "-np", "1", "--device",
                               "cuda", "--timeout", "120", str(script)], capture_output=True,
                              text=True, timeout=180, cwd=ROOT)
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and "backend nccl device cuda:0 sum 3.0" in line, (
        f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}")
    return line


@check("activations", "module 02's activation formula against CUDA's allocator", cluster=False)
def activations(args: argparse.Namespace, shared: dict) -> str:
    from lib_dist.train.memory import gpt_activation_bytes
    model = small_gpt("cuda")
    x, y = batch("cuda", rows=16)
    F.cross_entropy(model(x).reshape(-1, 96), y.reshape(-1)).backward()  # cuBLAS's workspace
    del x, y
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"]
    x, y = batch("cuda", rows=16)
    loss = F.cross_entropy(model(x).reshape(-1, 96), y.reshape(-1))
    held = torch.cuda.memory_allocated() - before
    count = torch.cuda.memory_stats()["allocation.all.allocated"] - allocations
    predicted = gpt_activation_bytes(model.config, 16)
    del loss
    # the allocator rounds each allocation up to 512 bytes; the formula itself is checked
    # within 2% of the saved tensors on the CPU (tests/test_train.py)
    tolerance = 0.02 * predicted + 512 * count
    assert abs(held - predicted) <= tolerance, f"held {held}, predicted {predicted}"
    return (f"held {held / 2**20:.2f} MiB, predicted {predicted / 2**20:.2f} MiB: "
            f"{held / predicted - 1:+.2%}")


@check("LossScaler", "LossScaler's fp16 step against GradScaler's (goal <= 1.05)",
       cluster=False)
def scaler(args: argparse.Namespace, shared: dict) -> str:
    from scaler_rounds import cuda_lines
    lines, results = cuda_lines(args.rounds, calls=10, steps=3)
    print("\n".join(lines), flush=True)
    ratios = ", ".join(f"{n} gradients {r:.2f}" for n, r in results["alone_ratios"].items())
    assert results["step_ratio"] <= 1.05, f"step ratio {results['step_ratio']:.3f}"
    return f"step {results['step_ratio']:.3f} (noise {results['again_ratio']:.3f}); alone {ratios}"


import gpu_rows_sharding  # noqa: E402,F401 - module 9's rows, registered after these


def run_row(name: str, args: argparse.Namespace, shared: dict) -> tuple[str, str, str]:
    what, fn, cuda, cluster = CHECKS[name]
    try:
        if cuda and not torch.cuda.is_available():
            raise Skip("no CUDA on this machine")
        if cluster and importlib.util.find_spec("ipyparallel") is None:
            raise Skip("ipyparallel is not installed")
        return what, fn(args, shared), "pass"
    except Skip as e:
        return what, str(e), "skip"
    except Exception as e:
        shared.setdefault("failures", []).append((name, traceback.format_exc()))
        return what, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", "FAIL"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds of the scalers")
    args = parser.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.getenv("PYTHONPATH")]))
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
    print(f"torch {torch.__version__}, {where}, {gpus()} GPU(s); NCCL "
          f"{'.'.join(map(str, torch.cuda.nccl.version())) if gpus() else '-'}", flush=True)
    print("" if torch.cuda.is_available() else "no CUDA here: the rows that need a GPU are "
          "skipped", flush=True)
    shared: dict = {}
    rows: list[tuple[str, str, str]] = []
    try:
        for name in args.only:
            rows.append(run_row(name, args, shared))
            print(f"{name}: {rows[-1][2]}", flush=True)
    finally:
        if "cluster" in shared:
            shared["cluster"].stop()
    width = max(len(what) for what, _, _ in rows)
    print(f"\n{'what':<{width}}  {'status':<6}  result")
    for what, result, status in rows:
        print(f"{what:<{width}}  {status:<6}  {result}")
    for name, text in shared.get("failures", []):
        print(f"\n{name} FAILED:\n{text}", file=sys.stderr)
    return 1 if shared.get("failures") else 0


if __name__ == "__main__":
    sys.exit(main())
