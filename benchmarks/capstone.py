"""The capstone on 8 CPU ranks: module 2's tiny GPT under `lib_dist.three_d` in five (dp, pp, tp)
layouts, each step against the planner's prediction and against the same model and layout
built from torch's own parts, and a checkpoint's save and load against
`torch.distributed.checkpoint` used directly; all in one run, on one `Cluster` of 8 engines
(gloo).

1. Calibration (`capstone_calibrate.py`), every rank at once as a step runs them: the matmul
   rate, the GPT's own rate on a micro-batch (its MFU), gloo's point-to-point alpha and beta,
   gloo's all-reduce in groups of 2, 4 and 8: the planner's `Machines` for this CPU. It opens
   every round of every layout: on a shared machine whose load moves by the minute, each
   round's steps are predicted from that round's machine, and the ratio measured / predicted
   is taken round by round (medians).
2. The planner's prediction, `price(..., as_run=True)` (the step `three_d_step` runs), checked
   twice: against one step on the virtual clock (`lib_dist.three_d.clocked.measured_step`: 8
   simulated ranks, the stages' FLOPs at the measured rate, messages at the measured alpha
   and beta, the simulated all-reduce gather-broadcast over links that are not shared), and
   against the 8 real ranks' step. The idealised planner (`as_run=False`: a ring, dp's
   all-reduce hidden behind backward, equal stages) is printed beside it.
3. Each layout's step, lib_dist's `three_d_step` against torch's composition
   (`capstone_torch.py`: DeviceMesh, DTensor TP, pipelining's Schedule1F1B, FSDP2 over dp;
   DDP under the pipeline does not average: see there), AdamW,
   interleaved rounds (`rounds.py`; the order flips every round), the slowest rank's time
   per round, medians.
4. Checkpoint save and load at (2, 2, 2), lib_dist's against `dcp` called directly on the same
   tensors.

Writes `out/capstone.txt` and `out/capstone.json` (`--out`: another folder). `--quick`: one
layout, one round, one step (a smoke test, about a minute).

    python benchmarks/capstone.py [--rounds 5] [--steps 2] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from lib_dist.cluster import Cluster
from lib_dist.comm import AlphaBeta
from lib_dist.three_d import Layout
from lib_dist.three_d.planner import Machines, price

from capstone_calibrate import summary
from capstone_steps import checkpoint_times, layout_steps
from tiny_gpt import tiny_gpt

OUT = Path(__file__).resolve().parent / "out"
LAYOUTS = ((2, 2, 2), (4, 1, 2), (2, 4, 1), (1, 2, 4), (8, 1, 1))
BATCH, MICRO_BATCH, RANKS = 16, 2, 8  # sequences a step; a micro-batch's; ranks


def machines_of(cal: dict[str, Any]) -> Machines:
    """The planner's cluster as calibrated: one node of 8 ranks, each at the rate measured
    while all computed at once, gloo's fitted link, gloo's all-reduce lines by group size."""
    link = AlphaBeta(cal["alpha"], cal["beta"])
    return Machines(devices=RANKS, per_node=RANKS, memory=2.0 ** 40, flops=cal["matmul_flops"],
                    mfu=cal["mfu"], intra=link, inter=link,
                    all_reduce={int(n): AlphaBeta(*ab)
                                for n, ab in cal["all_reduce_lines"].items()})


def on_the_clock(machines: Machines) -> Machines:
    """The same cluster as the virtual clock runs it: the simulated all-reduce is
    gather-broadcast, two messages deep on links that are not shared, 2 (alpha + n / beta)."""
    link = machines.intra
    return Machines(**{**vars(machines),
                       "all_reduce": {n: AlphaBeta(2 * link.alpha, link.beta / 2)
                                      for n in (2, 4, 8)}})


def slowest(per_rank: list[dict[str, Any]], name: str) -> list[float]:
    """Each round's seconds of the slowest rank."""
    key = (lambda r: r["seconds"][name]) if "seconds" in per_rank[0] else (lambda r: r[name])
    return [max(each) for each in zip(*(key(r) for r in per_rank))]


def median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def one_layout(config: Any, shape: tuple[int, int, int], per_rank: list[dict[str, Any]],
               say: Any) -> dict[str, Any]:
    """A layout's figures: each round's slowest steps, against each other and against the
    planner's prediction from that round's calibration; and the virtual clock's check."""
    layout = Layout(*shape)
    rounds = len(per_rank[0]["calibrations"])
    cals = [summary([r["calibrations"][i] for r in per_rank]) for i in range(rounds)]
    ours, theirs = slowest(per_rank, "lib_dist"), slowest(per_rank, "torch")
    # each round: its calibration's prediction, for the `steps` steps timed after it
    plans = [price(config, layout, machines_of(c), BATCH, MICRO_BATCH, 4, as_run=True)
             for c in cals]
    predicted = [p.step_s for p in plans for _ in range(len(ours) // rounds)]
    say(f"{layout}: calibrated per round, medians: matmul "
        f"{statistics.median(c['matmul_flops'] for c in cals) / 1e9:.2f} GFLOP/s a rank, MFU "
        f"{statistics.median(c['mfu'] for c in cals):.0%}, gloo alpha "
        f"{statistics.median(c['alpha'] for c in cals) * 1e3:.2f} ms, all-reduce of 8 B on "
        f"2 / 4 / 8 ranks " + " / ".join(
            f"{statistics.median(c['all_reduce'][f'{n}/8'] for c in cals) * 1e3:.2f}"
            for n in (2, 4, 8)) + " ms")
    out: dict[str, Any] = {
        "lib_dist_s": statistics.median(ours), "torch_s": statistics.median(theirs),
        "lib_dist_over_torch": median_ratio(ours, theirs),
        "predicted_s": statistics.median(predicted),
        "measured_over_predicted": median_ratio(ours, predicted),
        "parts_s": {k: statistics.median(getattr(p, k) for p in plans)
                    for k in ("compute_s", "bubble_s", "tp_s", "pp_s", "dp_exposed_s")},
        "calibrations": cals, "losses": [r["losses"] for r in per_rank]}
    replicas = [r["losses"]["torch"] for r in per_rank if r["losses"].get("torch") is not None]
    out["torch_replicas_mean_loss"] = sum(replicas) / len(replicas)
    say(f"{layout}: last loss lib_dist {out['losses'][0]['lib_dist']:.6f}, torch's replicas' "
        f"mean {out['torch_replicas_mean_loss']:.6f} (the same steps on the same batch)")
    return out | on_the_virtual_clock(config, layout, machines_of(cals[0]))


def on_the_virtual_clock(config: Any, layout: Layout, machines: Machines) -> dict[str, Any]:
    """The planner's step on the virtual clock's cluster and one clocked step measured; the
    idealised planner's on the real ranks' cluster, where it can price the layout."""
    from lib_dist.three_d.clocked import measured_step

    clock = on_the_clock(machines)
    out: dict[str, Any] = {"clock_predicted_s": price(config, layout, clock, BATCH, MICRO_BATCH, 4,
                                      as_run=True).step_s,
           "clock_measured_s": measured_step(layout, config, clock, BATCH, MICRO_BATCH)}
    try:
        out["idealised_s"] = price(config, layout, machines, BATCH, MICRO_BATCH, 4).step_s
    except ValueError:  # more stages than blocks: the idealised planner cuts blocks only
        out["idealised_s"] = None
    return out


def measure(args: argparse.Namespace, say: Any) -> dict[str, Any]:
    config, _, _ = tiny_gpt()
    layouts = LAYOUTS[:1] if args.quick else LAYOUTS
    found: dict[str, Any] = {"config": vars(config), "batch": BATCH,
                             "micro_batch": MICRO_BATCH, "layouts": {}}
    with Cluster(RANKS, timeout=600) as cluster:
        for shape in layouts:
            per_rank = cluster.run(layout_steps, config, shape, BATCH, MICRO_BATCH,
                                   args.rounds, args.steps, 3 if args.quick else 5)
            found["layouts"][str(shape)] = one_layout(config, shape, per_rank, say)
        with tempfile.TemporaryDirectory() as folder:
            times = cluster.run(checkpoint_times, config, LAYOUTS[0], BATCH, MICRO_BATCH,
                                args.rounds, folder)
        found["checkpoint"] = {k: statistics.median(slowest(times, k)) for k in times[0]}
    return found


def report(found: dict[str, Any], say: Any) -> None:
    say(f"{'layout':10s} {'lib_dist ms':>11s} {'predicted':>9s} {'meas/pred':>9s} "
        f"{'idealised':>9s} {'clock ms':>8s} {'clock pred':>10s} {'meas/pred':>9s} "
        f"{'torch ms':>8s} {'lib/torch':>9s}")
    for shape, r in found["layouts"].items():
        ideal = f"{r['idealised_s'] * 1e3:9.1f}" if r["idealised_s"] else f"{'n/a':>9s}"
        say(f"{shape:10s} {r['lib_dist_s'] * 1e3:11.1f} {r['predicted_s'] * 1e3:9.1f} "
            f"{r['measured_over_predicted']:9.2f} {ideal} "
            f"{r['clock_measured_s'] * 1e3:8.1f} {r['clock_predicted_s'] * 1e3:10.1f} "
            f"{r['clock_measured_s'] / r['clock_predicted_s']:9.3f} {r['torch_s'] * 1e3:8.1f} "
            f"{r['lib_dist_over_torch']:9.2f}")
    c = found["checkpoint"]
    say(f"checkpoint at (2, 2, 2), slowest rank, medians: save lib_dist "
        f"{c['lib_dist save'] * 1e3:.1f} ms against dcp direct {c['dcp save'] * 1e3:.1f} ms "
        f"({c['lib_dist save'] / c['dcp save']:.2f}x); load {c['lib_dist load'] * 1e3:.1f} "
        f"against {c['dcp load'] * 1e3:.1f} ms ({c['lib_dist load'] / c['dcp load']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="(2, 2, 2) only, one round")
    parser.add_argument("--out", type=Path, default=OUT, help="where the results go")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 1
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"module 2's tiny GPT on {RANKS} CPU ranks (gloo), global batch {BATCH} x 64 tokens, "
        f"micro-batches of {MICRO_BATCH}, float32, AdamW; medians of {args.rounds} rounds of "
        f"{args.steps} steps, slowest rank")
    found = measure(args, say)
    report(found, say)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "capstone.txt").write_text("\n".join(lines) + "\n")
    (args.out / "capstone.json").write_text(json.dumps({"args": vars(args), **found}, indent=1,
                                                  default=str))


if __name__ == "__main__":
    main()
