"""Module 9's rows of benchmarks/gpu_check.py, on CUDA:

- ZeRO-2: 3 AdamW steps of `Zero2Optimizer` on the GPU rank (NCCL) leave a plain AdamW's
  parameters;
- FSDP: 3 AdamW steps of `FSDP` with prefetch on the GPU rank leave the parameters of a plain
  AdamW and of torch's FSDP2 (`fully_shard`) on the same rank;
- recompute: module 2's GPT with dropout on the GPU, its blocks recomputed fully
  (`checkpoint_blocks`, and torch's `checkpoint`) and selectively (`selective_blocks`): the
  plain model's gradients (CUDA's generator replayed), and the allocator's peak of each.
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import cloudpickle
import torch
import torch.nn.functional as F

from gpu_rows import assert_adamw_close, batch, check, needs_cluster, small_gpt

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the engines cannot import this

STEPS, LR = 3, 1e-2


def trained(model: torch.nn.Module, optimizer: Any, device: str) -> None:
    for k in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(device, rows=2 + k)
        F.cross_entropy(model(x).reshape(-1, 96), y.reshape(-1)).backward()
        optimizer.step()


def plain_parameters(device: str) -> dict[str, torch.Tensor]:
    model = small_gpt(device)
    trained(model, torch.optim.AdamW(model.parameters(), lr=LR), device)
    return {name: p.detach().cpu() for name, p in model.named_parameters()}


def zero2_steps(comm: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    from lib_dist.sharding import Zero2Optimizer
    device = str(comm.device)
    model = small_gpt(device)
    trained(model, Zero2Optimizer(model.parameters(), comm, torch.optim.AdamW, lr=LR), device)
    return ({name: p.detach().cpu() for name, p in model.named_parameters()},
            plain_parameters(device))


def fsdp_steps(comm: Any) -> tuple[dict[str, torch.Tensor], ...]:
    from lib_dist.sharding import FSDP
    from lib_dist.sharding.fsdp import torch_fully_sharded
    device = str(comm.device)
    ours = small_gpt(device)
    sharded = FSDP(ours, comm, units=list(ours.blocks), prefetch=True)
    trained(sharded, torch.optim.AdamW(sharded.parameters(), lr=LR), device)
    theirs = small_gpt(device)
    torch_fully_sharded(theirs, theirs.blocks, comm.world_size, comm.device.type)
    trained(theirs, torch.optim.AdamW(theirs.parameters(), lr=LR), device)
    fsdp2 = {name: p.full_tensor().detach().cpu() for name, p in theirs.named_parameters()}
    return ({k: v.cpu() for k, v in sharded.full_state_dict().items()}, fsdp2,
            plain_parameters(device))


@check("ZeRO-2", "Zero2Optimizer on the GPU rank: a plain AdamW's parameters")
def zero2(args: argparse.Namespace, shared: dict) -> str:
    [(sharded, plain)] = needs_cluster(shared).run(zero2_steps)
    same = assert_adamw_close(sharded, plain, STEPS, LR)
    return f"{STEPS} steps: {len(plain)} parameters agree ({same} bit for bit)"


@check("FSDP", "FSDP (prefetch) on the GPU rank: plain AdamW's and FSDP2's parameters")
def fsdp(args: argparse.Namespace, shared: dict) -> str:
    [(ours, fsdp2, plain)] = needs_cluster(shared).run(fsdp_steps)
    same_plain = assert_adamw_close(ours, plain, STEPS, LR)
    same_fsdp2 = assert_adamw_close(ours, fsdp2, STEPS, LR)
    return (f"{STEPS} steps: {len(plain)} parameters agree with plain AdamW ({same_plain} bit "
            f"for bit) and FSDP2 ({same_fsdp2})")


def gradients_and_peak(model: torch.nn.Module, rows: int = 16) -> tuple[list[torch.Tensor], int]:
    x, y = batch("cuda", rows=rows)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(11)  # dropout's masks, from CUDA's generator
    F.cross_entropy(model(x).reshape(-1, 96), y.reshape(-1)).backward()
    torch.cuda.synchronize()
    grads = [p.grad.cpu() for p in model.parameters() if p.grad is not None]
    return grads, torch.cuda.max_memory_allocated() - base


@check("recompute", "full and selective recomputation on CUDA: the plain gradients",
       cluster=False)
def recompute(args: argparse.Namespace, shared: dict) -> str:
    from lib_dist.models import GPT, GPTConfig
    from lib_dist.recompute import TorchCheckpointed, checkpoint_blocks, selective_blocks
    torch.manual_seed(0)
    plain = GPT(GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=64,
                          dropout=0.1)).cuda()
    variants = {"full": copy.deepcopy(plain), "torch": copy.deepcopy(plain),
                "selective": copy.deepcopy(plain)}
    checkpoint_blocks(variants["full"].blocks)
    checkpoint_blocks(variants["torch"].blocks, wrapper=TorchCheckpointed)
    selective_blocks(variants["selective"].blocks)
    gradients_and_peak(plain)  # cuBLAS's workspace, allocated once
    want, plain_peak = gradients_and_peak(plain)
    peaks = {}
    eps = torch.finfo(torch.float32).eps
    for name, model in variants.items():
        got, peaks[name] = gradients_and_peak(model)
        for a, b in zip(got, want):
            # the same kernels on the same numbers; a residual's two gradients may be summed
            # in the other order: within eps of the largest
            assert (a - b).abs().max() <= 64 * eps * b.abs().max(), f"{name}: a gradient differs"
    return ", ".join([f"peak plain {plain_peak / 2**20:.1f} MiB"] + [
        f"{name} {peak / 2**20:.1f}" for name, peak in peaks.items()])
