"""Mixed precision and memory (module 07): number formats, dynamic loss scaling, fp32 master
weights, and ZeRO's sharding of the optimizer state.

- `formats`: fp32, fp16, bf16 and fp8 bit by bit (`encode`, `decode`, `format_table`);
- `LossScaler` (`scaler`): dynamic loss scaling with `torch.amp.GradScaler`'s decisions;
- `MasterWeights` (`master`): an optimizer stepping fp32 copies of half-precision parameters;
- `DistributedLossScaler` (`distributed`): every rank skips when any rank overflowed;
- `ZeroOptimizer` (`zero`): ZeRO stage 1 on `lib_dist.comm`;
- `memory`: bytes per parameter, per rank under each ZeRO stage, and traffic per step;
- `experiments`: the course's measurements (training curves by precision, gradient
  magnitudes, which ops autocast runs in which dtype).
"""

from ..train.memory import optimizer_state_bytes
from .distributed import DistributedLossScaler
from .formats import FORMATS, Format, decode, encode, format_table, torch_bits
from .master import MasterWeights
from .memory import PerParameter, bytes_per_parameter, zero_bytes_per_rank, zero_traffic_per_rank
from .scaler import LossScaler
from .zero import ZeroOptimizer

__all__ = [
    "DistributedLossScaler", "FORMATS", "Format", "LossScaler", "MasterWeights", "PerParameter",
    "ZeroOptimizer", "bytes_per_parameter", "decode", "encode", "format_table",
    "optimizer_state_bytes", "torch_bits", "zero_bytes_per_rank", "zero_traffic_per_rank",
]
