r"""What the Triton kernels cost a Hopper multiprocessor, found without a GPU.

Triton compiles ahead of time for a target it is told about (here ``sm_90``, the H100 and
H200), and the ``cuobjdump`` shipped in Triton's wheel reads the registers, the stack (spilled
registers) and the shared memory off the machine code. A launch shape that spills runs several
times slower, and one whose shared memory exceeds the multiprocessor's 227 KB does not launch at
all; both show here, on the CPU, which is how :data:`~gpscale.linalg.triton.FORWARD_SHAPE` and
:data:`~gpscale.linalg.triton.BACKWARD_SHAPE` were chosen without a GPU.

:func:`usage` compiles one kernel; :func:`defaults` the forward and the symmetric backward at
the default shapes. ``python -m gpscale.linalg.triton.resources`` prints a table of shapes.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any

__all__ = ["HOPPER_SHARED_BYTES", "KERNELS", "defaults", "usage"]

HOPPER_SHARED_BYTES = 232_448
"""Shared memory one program may take on an sm_90 multiprocessor (227 KB)."""

_INTS = {
    "forward": "n1 n2 k s_z1b s_z1n s_z2b s_z2n s_vb s_vn s_ob s_on",
    "backward_symmetric": "n k s_zb s_zn s_vb s_vn s_gb s_gn s_ob s_on",
    "backward_rows": "n1 n2 k s_z1b s_z1n s_z2b s_z2n s_vb s_vn s_gb s_gn s_zb s_zn",
    "backward_cols": "n1 n2 k s_z1b s_z1n s_z2b s_z2n s_vb s_vn s_gb s_gn s_zb s_zn s_gvb s_gvn",
}
_POINTERS = {"forward": ("Z1", "Z2", "V", "OUT"), "backward_symmetric": ("Z", "V", "GOUT", "GZ"),
             "backward_rows": ("Z1", "Z2", "V", "GOUT", "GZ1"),
             "backward_cols": ("Z1", "Z2", "V", "GOUT", "GZ2", "GV")}
KERNELS = tuple(_INTS)
"""The kernels :func:`usage` compiles."""


def _constants(kernel: str, shape: dict[str, int], d: int, k: int, precisions: tuple[str, str],
               profile: int) -> dict[str, Any]:
    from gpscale.linalg.triton import CHUNK_COLUMNS, _pow2

    common = dict(PROFILE=profile, DDOT=d, EXACT=0, DPAD=_pow2(d), BM=shape["BM"],
                  BN=shape["BN"], CHUNK=max(CHUNK_COLUMNS, shape["BM"], shape["BN"]),
                  PREC_D=precisions[0], PREC_V=precisions[1])
    bk = min(_pow2(k), 64)
    if kernel == "forward":
        return common | {"BK": bk, "SYMMETRIC": True}
    if kernel == "backward_symmetric":
        return common | {"DFULL": _pow2(d), "K2PAD": _pow2(2 * k)}
    common |= {"DFULL": _pow2(d), "BK": bk}
    return common if kernel == "backward_rows" else common | {"KPAD": bk, "NEED_Z": True,
                                                              "NEED_V": True}


def usage(kernel: str, shape: dict[str, int], *, d: int = 8, k: int = 64,
          precisions: tuple[str, str] = ("ieee", "ieee"), profile: int = 2,
          dtype: str = "fp32") -> dict[str, int]:
    """Registers per thread, stack bytes per thread (spills) and shared bytes per program of
    ``kernel`` (one of :data:`KERNELS`) compiled for sm_90 at ``shape``
    (BM, BN, W warps, S stages), for d inputs and k right-hand sides (Matérn-3/2 by default).

    Under Triton's interpreter (``TRITON_INTERPRET=1``, which replaces the kernels by Python
    functions) the compilation runs in a child process without it.

    Raises:
        RuntimeError: Triton cannot compile ahead of time here, or cuobjdump is missing.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        return _in_child(kernel, shape, d, k, list(precisions), profile, dtype)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gpscale.linalg.triton import stationary

    constants = _constants(kernel, shape, d, k, precisions, profile)
    signature = {name: f"*{dtype}" for name in _POINTERS[kernel]}
    signature |= {name: "i32" for name in _INTS[kernel].split()}
    signature |= {name: "constexpr" for name in constants}
    try:
        source = ASTSource(fn=getattr(stationary, kernel), signature=signature,
                           constexprs=constants)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": shape["W"], "num_stages": shape["S"]})
    except TypeError as err:  # an older Triton names the arguments differently
        raise RuntimeError(f"this Triton ({triton.__version__}) cannot compile ahead of time "
                           f"here: {err}") from err
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    if not os.path.exists(tool):
        raise RuntimeError(f"no cuobjdump at {tool}")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        text = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True,
                              check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump gave no register counts: {text[-300:]}")
    return {"registers": int(found[1]), "stack_bytes": int(found[2]),
            "shared_bytes": int(compiled.metadata.shared)}


def _in_child(*args) -> dict[str, int]:
    import json
    import sys

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = ("import json, sys; from gpscale.linalg.triton.resources import usage; "
            "a = json.loads(sys.argv[1]); a[4] = tuple(a[4]); "
            "print(json.dumps(usage(a[0], a[1], d=a[2], k=a[3], precisions=a[4], "
            "profile=a[5], dtype=a[6])))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True,
                          text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"compiling for sm_90 failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def defaults(d: int = 8, k: int = 64) -> dict[str, dict[str, int]]:
    """:func:`usage` of the forward and the symmetric backward at their default shapes and
    precisions, float32."""
    import torch

    from gpscale.linalg.triton import (
        BACKWARD_SHAPE,
        FORWARD_SHAPE,
        _backward_precision_args,
        _precision_args,
    )

    like = torch.zeros(1, dtype=torch.float32)
    forward = _precision_args(like)
    backward = _backward_precision_args(like)
    return {"forward": usage("forward", FORWARD_SHAPE, d=d, k=k,
                             precisions=(forward["PREC_D"], forward["PREC_V"])),
            "backward_symmetric": usage("backward_symmetric", BACKWARD_SHAPE, d=d, k=k,
                                        precisions=(backward["PREC_D"], backward["PREC_V"]))}


def _table() -> None:
    shapes = [(128, 32, 4), (128, 32, 8), (128, 64, 8), (64, 64, 4), (64, 32, 4), (256, 32, 8)]
    print("kernel             BM  BN  W S  precisions      regs stack shared")
    for kernel, precisions in (("forward", ("ieee", "ieee")), ("forward", ("ieee", "tf32x3")),
                               ("backward_symmetric", ("ieee", "tf32x3"))):
        for bm, bn, w in shapes:
            for stages in (2, 3):
                shape = {"BM": bm, "BN": bn, "W": w, "S": stages}
                try:
                    got = usage(kernel, shape, precisions=precisions)
                except Exception as err:  # noqa: BLE001 - a shape that fails is a line
                    print(f"{kernel:18} {bm:3} {bn:3} {w} {stages}  {err}")
                    continue
                print(f"{kernel:18} {bm:3} {bn:3} {w} {stages}  {','.join(precisions):14} "
                      f"{got['registers']:4} {got['stack_bytes']:5} {got['shared_bytes']:6}")


if __name__ == "__main__":
    _table()
