"""Model FLOPs utilisation (MFU) of module 2's GPT training, with the course's written-out
attention and with torch's fused `scaled_dot_product_attention`, in the same run.

Tokens per second over timed steps (after warm-up), times the model FLOPs per token
(`lib_dist.train.utilisation.flops_per_token`), over the peak matmul rate measured on the
same device in the step's dtype. On a GPU: bf16 autocast, fused AdamW, and CUDA's peak
allocation; `--size gpt2` is GPT-2 small (124 M parameters, 1024 tokens).

    python benchmarks/utilisation.py [--device cuda --size gpt2 --batch 16]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lib_dist.models import GPT, GPTConfig  # noqa: E402
from lib_dist.train.utilisation import flops_per_token, mfu, peak_matmul_flops  # noqa: E402

SIZES = {"tiny": GPTConfig(vocab_size=96, block_size=128, n_layer=4, n_head=4, n_embd=128),
         "gpt2": GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12,
                           n_embd=768)}


def tokens_per_second(config: GPTConfig, device: str, batch: int, steps: int) -> tuple[float,
                                                                                      int]:
    """Training throughput, and CUDA's peak bytes (0 on the CPU)."""
    torch.manual_seed(0)
    model = GPT(config).to(device)
    cuda = device.startswith("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    x = torch.randint(0, config.vocab_size, (batch, config.block_size + 1), device=device)
    inputs, targets = x[:, :-1], x[:, 1:]
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda
                else contextlib.nullcontext())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size),
                                                     targets.reshape(-1))
        loss.backward()
        optimizer.step()

    for _ in range(2):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return batch * config.block_size * steps / seconds, (
        torch.cuda.max_memory_allocated() if cuda else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--size", default="tiny", choices=list(SIZES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    peak = peak_matmul_flops(args.device, dtype, n=8192 if cuda else 1024)
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"{where}: peak {dtype} matmul measured {peak / 1e12:.2f} TFLOP/s; GPT {args.size}, "
          f"batch {args.batch} x {SIZES[args.size].block_size}, {args.steps} timed steps")
    for fused in (False, True):
        config = GPTConfig(**{**SIZES[args.size].__dict__, "fused_attention": fused})
        rate, held = tokens_per_second(config, args.device, args.batch, args.steps)
        name = "fused (SDPA)" if fused else "written out"
        print(f"  attention {name:13s}: {rate:10.0f} tokens/s, "
              f"{flops_per_token(config) / 1e6:.1f} MFLOP/token, MFU "
              f"{mfu(rate, config, peak):.1%}" + (f", peak {held / 2**30:.1f} GiB" if cuda else ""))


if __name__ == "__main__":
    main()
