"""Checks of the Triton kernels without a GPU: running them in Triton's interpreter (`interpreted`), and compiling
them for a Hopper GPU (`compile_for_hopper`), which refuses what the interpreter lets through (a global that is not
a `tl.constexpr`, for one)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def interpreted(script: str, payload, tmp_path):
    """`TRITON_INTERPRET=1` must be set before Triton compiles anything, so the kernels run in a subprocess. Save
    `payload`, run `script` (Python reading `sys.argv[1]` with `torch.load` and writing its result to
    `sys.argv[2]` with `torch.save`) under the interpreter, and return what it saved."""
    torch.save(payload, tmp_path / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(tmp_path / "out.pt")


def compile_for_hopper(kernel, signature: dict[str, str], constants: dict, num_warps: int) -> bytes:
    """Triton's compiler on `kernel` (argument types in `signature`, "constexpr" for `constants`' names) down to an
    sm90 cubin, which needs no GPU; returns the cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["cubin"]
