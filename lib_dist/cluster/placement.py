"""Which device each rank gets: GPU i for the i-th rank on a host when every rank has a GPU
(or when asked for "cuda"), else the CPU."""

from __future__ import annotations

from typing import Any


def assign_devices(ranks: list[dict[str, Any]], device: str) -> None:
    """Set "local_rank" and "device" in each rank's description (its "host" and "gpus", as
    `engine.describe` reports them). `device`: "auto", "cpu" or "cuda"."""
    hosts: dict[str, int] = {}
    for info in ranks:
        info["local_rank"] = hosts[info["host"]] = hosts.get(info["host"], -1) + 1
    if device == "cuda":
        for host, count in hosts.items():
            gpus = next(i["gpus"] for i in ranks if i["host"] == host)
            check_gpus(count + 1, gpus, f"host {host}")
    use_gpu = device == "cuda" or (
        device == "auto" and all(i["local_rank"] < i["gpus"] for i in ranks))
    for info in ranks:
        info["device"] = f"cuda:{info['local_rank']}" if use_gpu else "cpu"


def check_gpus(ranks: int, gpus: int, where: str) -> None:
    if ranks > gpus:
        raise ValueError(f"{ranks} GPU ranks requested on {where}, which has {gpus} GPU"
                         f"{'' if gpus == 1 else 's'}; use fewer ranks or device='cpu'")
