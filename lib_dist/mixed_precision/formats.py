"""Floating-point formats bit by bit: fp32, fp16, bf16 and the two fp8s.

A binary floating-point number is a sign bit, E exponent bits and M mantissa bits. With
bias = 2^(E-1) - 1, a normal number (exponent field e between 1 and 2^E - 2) is
(-1)^s * 2^(e - bias) * (1 + m / 2^M); exponent field 0 holds the subnormals,
(-1)^s * 2^(1 - bias) * (m / 2^M), which fill the gap between 0 and the smallest normal number;
the all-ones field holds inf and nan. So E sets the range and M the precision: the spacing
between 1 and the next number (machine epsilon) is 2^-M.

`encode` and `decode` do this arithmetic by hand (rounding to nearest, ties to even, as the
hardware does); `torch_bits` reads the bits torch actually stores, for comparison. fp8 e4m3
("fn": finite, no inf) spends the all-ones exponent on numbers, keeping one nan pattern; torch
saturates a number too large for it to its largest, 448.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch


@dataclass(frozen=True)
class Format:
    """A floating-point format: its torch dtype and how its bits are split."""

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    has_inf: bool = True

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def finfo(self) -> torch.finfo:
        return torch.finfo(self.dtype)

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)


FORMATS = {
    "fp32": Format("fp32", torch.float32, 8, 23),
    "fp16": Format("fp16", torch.float16, 5, 10),
    "bf16": Format("bf16", torch.bfloat16, 8, 7),
    "fp8 e4m3": Format("fp8 e4m3", torch.float8_e4m3fn, 4, 3, has_inf=False),
    "fp8 e5m2": Format("fp8 e5m2", torch.float8_e5m2, 5, 2),
}


def encode(value: float, fmt: Format) -> str:
    """The bits of `value` rounded to `fmt`, as 'sign exponent mantissa' (spaces between)."""
    E, M = fmt.exponent_bits, fmt.mantissa_bits
    sign = "1" if math.copysign(1.0, value) < 0 else "0"
    if math.isnan(value):
        return f"{sign} {'1' * E} {'1' * M}"
    if math.isinf(value):
        return _fields(sign, 2**E - 1, 0, fmt) if fmt.has_inf else _largest(sign, fmt)
    x = Fraction(abs(value))
    if x == 0:
        return _fields(sign, 0, 0, fmt)
    exponent = max(_floor_log2(x), 1 - fmt.bias)  # below the normal range: subnormal spacing
    units = round(x / Fraction(2) ** (exponent - M))  # Fraction rounds ties to even
    if units == 2 ** (M + 1):  # rounding carried into the next power of two
        units, exponent = units // 2, exponent + 1
    if units < 2**M:
        return _fields(sign, 0, units, fmt)
    field = exponent + fmt.bias
    if not fmt.has_inf and (field, units - 2**M) > (2**E - 1, 2**M - 2):
        return _largest(sign, fmt)
    if field > 2**E - 2 and fmt.has_inf:
        return encode(math.copysign(math.inf, value), fmt)
    return _fields(sign, field, units - 2**M, fmt)


def decode(bits: str, fmt: Format) -> float:
    """The number that `bits` ('sign exponent mantissa', spaces optional) stands for."""
    raw = bits.replace(" ", "")
    E, M = fmt.exponent_bits, fmt.mantissa_bits
    sign = -1.0 if raw[0] == "1" else 1.0
    field, mantissa = int(raw[1:1 + E], 2), int(raw[1 + E:], 2)
    if field == 2**E - 1 and (fmt.has_inf or mantissa == 2**M - 1):
        return sign * math.inf if fmt.has_inf and mantissa == 0 else math.nan
    if field == 0:
        return sign * math.ldexp(mantissa, 1 - fmt.bias - M)
    return sign * math.ldexp(2**M + mantissa, field - fmt.bias - M)


def torch_bits(value: float, fmt: Format) -> str:
    """The bits torch stores for `value` converted to `fmt`'s dtype, split as `encode`'s."""
    integer = {8: torch.uint8, 16: torch.int16, 32: torch.int32}[fmt.bits]
    stored = int(torch.tensor([value], dtype=torch.float64).to(fmt.dtype).view(integer)[0])
    raw = format(stored & (2**fmt.bits - 1), f"0{fmt.bits}b")
    return f"{raw[0]} {raw[1:1 + fmt.exponent_bits]} {raw[1 + fmt.exponent_bits:]}"


def _floor_log2(x: Fraction) -> int:
    e = x.numerator.bit_length() - x.denominator.bit_length()
    return e if Fraction(2) ** e <= x else e - 1


def _largest(sign: str, fmt: Format) -> str:
    """torch saturates a format without inf: too large a number becomes its largest one."""
    return _fields(sign, 2**fmt.exponent_bits - 1, 2**fmt.mantissa_bits - 2, fmt)


def _fields(sign: str, field: int, mantissa: int, fmt: Format) -> str:
    return (f"{sign} {format(field, f'0{fmt.exponent_bits}b')} "
            f"{format(mantissa, f'0{fmt.mantissa_bits}b')}")


def format_table() -> list[dict[str, object]]:
    """One row per format: bits, exponent/mantissa split, largest, smallest normal and
    subnormal numbers and machine epsilon, the numbers from `torch.finfo`."""
    return [{"format": f.name, "bits": f.bits, "exponent": f.exponent_bits,
             "mantissa": f.mantissa_bits, "max": f.finfo.max, "smallest normal": f.finfo.tiny,
             "smallest subnormal": f.smallest_subnormal, "eps": f.finfo.eps}
            for f in FORMATS.values()]
