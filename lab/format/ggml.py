"""ggml's tensor types: block size (elements) and bytes per block, for every type llama.cpp defines.

Sizes are computed from this table, so a file of any type can be planned and an unsupported one
named. `KERNEL_TYPES` is the table the WGSL kernels share (wgsl/quant.wgsl): for each type they read, the dequant
function and the HALF of its 8-value groups. It is the one list of the types the lab reads; the rest are known
but refused.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgmlType:
    id: int
    name: str
    block: int      # elements per block
    nbytes: int     # bytes per block

    def row_bytes(self, n: int) -> int:
        if n % self.block:
            raise ValueError(f"{self.name}: a row of {n} elements is not a whole number of {self.block}-element blocks")
        return n // self.block * self.nbytes


_TABLE = [
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84), (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144), (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210), (15, "Q8_K", 256, 292), (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98), (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82), (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2),
    (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2), (34, "TQ1_0", 256, 54), (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36), (41, "Q1_0", 128, 18), (42, "Q2_0", 64, 18),
]
TYPES: dict[int, GgmlType] = {i: GgmlType(i, n, b, s) for i, n, b, s in _TABLE}
BY_NAME: dict[str, GgmlType] = {t.name: t for t in TYPES.values()}

def type_name(type_id: int) -> str:
    t = TYPES.get(type_id)
    return t.name if t else f"unknown type {type_id}"


# type name -> (dequant function in quant.wgsl, HALF: a group is 4 values at e0 and 4 at e0 + HALF)
KERNEL_TYPES: dict[str, tuple[str, int]] = {
    "F32": ("dq_f32", 4), "F16": ("dq_f16", 4), "BF16": ("dq_bf16", 4), "Q8_0": ("dq_q8_0", 4),
    "Q4_0": ("dq_q4_0", 16), "Q4_1": ("dq_q4_1", 16), "Q5_0": ("dq_q5_0", 16), "Q5_1": ("dq_q5_1", 16),
    "Q2_K": ("dq_q2_k", 32), "Q3_K": ("dq_q3_k", 32), "Q4_K": ("dq_q4_k", 32), "Q5_K": ("dq_q5_k", 32),
    "Q6_K": ("dq_q6_k", 32), "IQ4_NL": ("dq_iq4_nl", 16), "IQ4_XS": ("dq_iq4_xs", 16),
    "TQ1_0": ("dq_tq1_0", 4), "TQ2_0": ("dq_tq2_0", 32), "MXFP4": ("dq_mxfp4", 16), "NVFP4": ("dq_nvfp4", 8),
    "IQ2_XXS": ("dq_iq2_xxs", 4), "IQ3_XXS": ("dq_iq3_xxs", 4), "IQ2_XS": ("dq_iq2_xs", 4), "IQ2_S": ("dq_iq2_s", 4),
    "IQ3_S": ("dq_iq3_s", 4), "IQ1_S": ("dq_iq1_s", 4), "IQ1_M": ("dq_iq1_m", 4), "Q1_0": ("dq_q1_0", 4),
    "Q2_0": ("dq_q2_0", 4),
}


SUPPORTED = frozenset(BY_NAME[n].id for n in KERNEL_TYPES)     # type ids the kernels read
