"""Ahead-of-time builds of every kernel for real GPUs, on a machine without one.

Triton's interpreter accepts code that a real compile rejects, so the CPU build check compiles each kernel to a
cubin for sm_80 and sm_90, for every block size and dtype the dispatch launches with, and reads registers and
stack + local memory (spill) bytes per thread from the cubin with cuobjdump (the compile metadata carries them
only once a driver loads the kernel).

    python -m ablate.kernels.aot            # the table
    python -m ablate.kernels.aot --json     # one JSON object per build (the test reads these)

Run it with TRITON_INTERPRET unset: the kernels must be real JIT functions.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ablate.kernels import cross_entropy_triton, rmsnorm_triton, rope_triton, swiglu_triton

TARGETS = (80, 90)
DTYPES = ("fp32", "bf16")


@dataclass
class Build:
    kernel: object  # a triton.JITFunction
    signature: dict
    constexprs: dict
    num_warps: int
    dtype: str
    block: str  # the block sizes, for the table


def builds() -> list[Build]:
    """Every (kernel, dtype, block size) the dispatch can launch."""
    out = []
    for dt in DTYPES:
        for block_d in rmsnorm_triton.BLOCK_SIZES:
            cfg = rmsnorm_triton.launch_config(block_d)
            blocks = {"BLOCK_ROWS": cfg["BLOCK_ROWS"], "BLOCK_D": cfg["BLOCK_D"]}
            label = f"{cfg['BLOCK_ROWS']}x{cfg['BLOCK_D']}"
            out.append(
                Build(
                    rmsnorm_triton.rms_norm_fwd_kernel,
                    {
                        "x_ptr": f"*{dt}",
                        "w_ptr": f"*{dt}",
                        "y_ptr": f"*{dt}",
                        "rstd_ptr": "*fp32",
                        "n_rows": "i32",
                        "n_cols": "i32",
                        "eps": "fp32",
                        "BLOCK_ROWS": "constexpr",
                        "BLOCK_D": "constexpr",
                    },
                    blocks,
                    cfg["num_warps"],
                    dt,
                    label,
                )
            )
            out.append(
                Build(
                    rmsnorm_triton.rms_norm_bwd_kernel,
                    {
                        "dy_ptr": f"*{dt}",
                        "x_ptr": f"*{dt}",
                        "w_ptr": f"*{dt}",
                        "rstd_ptr": "*fp32",
                        "dx_ptr": f"*{dt}",
                        "dw_partial_ptr": "*fp32",
                        "n_rows": "i32",
                        "n_cols": "i32",
                        "n_programs": "i32",
                        "tiles_per_program": "i32",
                        "BLOCK_ROWS": "constexpr",
                        "BLOCK_D": "constexpr",
                    },
                    blocks,
                    cfg["num_warps"],
                    dt,
                    label,
                )
            )
        block = {"BLOCK": swiglu_triton.BLOCK}
        out.append(
            Build(
                swiglu_triton.swiglu_fwd_kernel,
                {
                    "gate_ptr": f"*{dt}",
                    "up_ptr": f"*{dt}",
                    "out_ptr": f"*{dt}",
                    "n_elements": "i32",
                    "BLOCK": "constexpr",
                },
                block,
                swiglu_triton.NUM_WARPS,
                dt,
                str(swiglu_triton.BLOCK),
            )
        )
        out.append(
            Build(
                swiglu_triton.swiglu_bwd_kernel,
                {
                    "dout_ptr": f"*{dt}",
                    "gate_ptr": f"*{dt}",
                    "up_ptr": f"*{dt}",
                    "dgate_ptr": f"*{dt}",
                    "dup_ptr": f"*{dt}",
                    "n_elements": "i32",
                    "BLOCK": "constexpr",
                },
                block,
                swiglu_triton.NUM_WARPS,
                dt,
                str(swiglu_triton.BLOCK),
            )
        )
        ints = (
            "n_elements",
            "n_heads",
            "seq_len",
            "head_dim",
            "half",
            "stride_b",
            "stride_h",
            "stride_s",
            "stride_d",
            "table_stride_b",
            "table_stride_h",
            "table_stride_s",
        )
        out.append(
            Build(
                rope_triton.rope_kernel,
                {
                    "x_ptr": f"*{dt}",
                    "cos_ptr": "*fp32",
                    "sin_ptr": "*fp32",
                    "out_ptr": f"*{dt}",
                    **dict.fromkeys(ints, "i32"),
                    "sin_sign": "fp32",
                    "BLOCK": "constexpr",
                },
                {"BLOCK": rope_triton.BLOCK},
                rope_triton.NUM_WARPS,
                dt,
                str(rope_triton.BLOCK),
            )
        )
        for write_grad in (True, False):
            out.append(
                Build(
                    cross_entropy_triton.cross_entropy_chunk_kernel,
                    {
                        "logits_ptr": f"*{dt}",
                        "targets_ptr": "*i64",
                        "ce_ptr": "*fp32",
                        "z_ptr": "*fp32",
                        "n_cols": "i32",
                        "ignore_index": "i32",
                        "z_loss": "fp32",
                        "WRITE_GRAD": "constexpr",
                        "BLOCK_V": "constexpr",
                    },
                    {"WRITE_GRAD": write_grad, "BLOCK_V": cross_entropy_triton.BLOCK_V},
                    cross_entropy_triton.NUM_WARPS,
                    dt,
                    f"{cross_entropy_triton.BLOCK_V}{'' if write_grad else ' (no grad)'}",
                )
            )
    return out


def resource_usage(cubin: bytes) -> dict:
    """Registers and stack + local memory bytes per thread (where ptxas puts spilled registers) of the cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [triton.knobs.nvidia.cuobjdump.path, "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    return {"registers": int(found[1]), "spill_bytes": int(found[2]) + int(found[4])} if found else {}


def compile_one(b: Build, arch: int) -> dict:
    if not isinstance(b.kernel, triton.runtime.JITFunction):
        raise RuntimeError("the kernels were imported under TRITON_INTERPRET=1; build them in a process without it")
    compiled = triton.compile(
        ASTSource(fn=b.kernel, signature=b.signature, constexprs=b.constexprs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": b.num_warps},
    )
    cubin = compiled.asm.get("cubin", b"")
    row = {
        "kernel": b.kernel.__name__,
        "target": f"sm_{arch}",
        "dtype": b.dtype,
        "block": b.block,
        "num_warps": b.num_warps,
        "cubin_bytes": len(cubin),
        "shared": compiled.metadata.shared,
    }
    # from the metadata where this Triton gives them (it fills n_regs/n_spills only when a driver loads the kernel)
    for key in ("n_regs", "n_spills"):
        if getattr(compiled.metadata, key, None) is not None:
            row[key] = getattr(compiled.metadata, key)
    return {**row, **(resource_usage(cubin) if cubin else {})}


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    if not as_json:
        print(f"{'kernel':28} {'target':7} {'dtype':5} {'block':16} {'warps':>5} {'regs':>5} {'spill B':>7}")
    for b in builds():
        for arch in TARGETS:
            row = compile_one(b, arch)
            if as_json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"{row['kernel']:28} {row['target']:7} {row['dtype']:5} {row['block']:16} {row['num_warps']:>5} "
                    f"{row.get('registers', '?'):>5} {row.get('spill_bytes', '?'):>7}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
