"""The GPU-only Triton paths compile for Hopper (sm_90) here, on a CPU.

The interpreter (TRITON_INTERPRET=1) runs every kernel's arithmetic on a CPU, but some paths exist
only compiled: programmatic dependent launch (griddepcontrol), which the interpreter never takes,
and whatever the interpreter accepts that the compiler refuses. Triton compiles for a named
target without a GPU (its wheel ships ptxas), so a compile error shows here, before device time
is spent on it. The kernels are the newest phase's copies; p15's combine differs from p17's (a
slice of dims), so it is compiled too. The compiles run in a fresh process without
TRITON_INTERPRET: under it, @triton.jit makes interpreted functions, which do not compile.
"""
from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

HOPPER = ("cuda", 90, 32)


def ptxas_available() -> bool:
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return bundled.exists() or shutil.which("ptxas") is not None


pytestmark = pytest.mark.skipif(not ptxas_available(), reason="no ptxas: Triton's wheel ships one; this install lacks it")


def compile_for_hopper(kernel, types: dict, constexprs: dict, **options):
    """kernel (a @triton.jit function) compiled for sm_90; arguments not named in `types` or
    `constexprs` are i32. Returns the compiled kernel (its .asm["ptx"], .metadata)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = inspect.signature(kernel.fn).parameters
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                          target=GPUTarget(*HOPPER), options=options)


def latent_case(tile_in_page: bool, pdl: bool):
    from phases.p19_quantization import triton_mla
    types = dict(q_ptr="*bf16", pool_ptr="*bf16", table_ptr="*i32", lens_ptr="*i32", o_ptr="*bf16",
                 lse_ptr="*fp32", scale="fp32")
    consts = dict(H=16, R=512, RV=512, P=64, PAGE=64, BLOCK_H=16, BLOCK_P=64, BLOCK_N=32, UPCAST=False,
                  WRITE_LSE=True, TILE_IN_PAGE=tile_in_page, PDL=pdl)
    return triton_mla._latent_split_kernel, types, consts, dict(num_warps=4, num_stages=2)


def gqa_case(phase: str, pdl: bool):
    module = __import__(f"phases.{phase}.triton_decode", fromlist=["_split_kernel"])
    types = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", table_ptr="*i32", lens_ptr="*i32", o_ptr="*fp32",
                 lse_ptr="*fp32", scale="fp32", out_ptr="*bf16", count_ptr="*i32")
    consts = dict(G=4, D=64, PAGE=16, S=128, BLOCK_G=16, BLOCK_N=64, UPCAST=False, WRITE_LSE=True, FUSE=False,
                  BLOCK_S=128, PDL=pdl)
    return module._split_kernel, types, consts, dict(num_warps=2, num_stages=3)


def combine_case(phase: str, pdl: bool):
    module = __import__(f"phases.{phase}.triton_decode", fromlist=["_combine_kernel"])
    types = dict(o_ptr="*bf16", lse_ptr="*fp32", out_ptr="*bf16")
    width = {"D": 64} if "D" in inspect.signature(module._combine_kernel.fn).parameters else {"BLOCK_D": 16}
    consts = dict(S=256, BLOCK_S=256, PDL=pdl, **width)
    return module._combine_kernel, types, consts, dict(launch_pdl=True) if pdl else {}


def quantizing_gemv_case(quant: int, split_k: int):
    from phases.p19_quantization import triton_int8
    int8 = quant == 1
    types = dict(a_ptr="*bf16", w_ptr="*i8" if int8 else "*fp8e4nv", a_scale_ptr="*fp32", w_scale_ptr="*fp32",
                 bias_ptr="*fp32", out_ptr="*bf16", partial_ptr="*i32" if int8 else "*fp32")
    consts = dict(HAS_BIAS=False, ACC=tl.int32 if int8 else tl.float32, SPLIT_K=split_k, BLOCK_M=1, BLOCK_N=4,
                  BLOCK_K=1024, QUANT=quant, QMAX=127.0 if int8 else 448.0)
    return triton_int8._w8a8_gemv_kernel, types, consts, dict(num_warps=4, num_stages=1)


CASES = {
    "latent split kernel, a tile in one page, PDL": lambda: latent_case(True, True),
    "p15 split kernel, PDL": lambda: gqa_case("p15_flash_decoding", True),
    "p15 combine, PDL": lambda: combine_case("p15_flash_decoding", True),
    "p19 combine (sliced), PDL": lambda: combine_case("p19_quantization", True),
    "p19 GEMV quantizing int8, split-K": lambda: quantizing_gemv_case(1, 4),
    "p19 GEMV quantizing e4m3": lambda: quantizing_gemv_case(2, 1),
}


def compile_all() -> dict:
    """In this process (no interpreter): every case -> what its PTX holds, or the error."""
    found = {}
    for name, case in CASES.items():
        kernel, types, constexprs, options = case()
        try:
            ptx = compile_for_hopper(kernel, types, constexprs, **options).asm["ptx"]
            found[name] = {"sm_90": ".target sm_90" in ptx, "griddepcontrol": "griddepcontrol" in ptx,
                           "pdl": bool(constexprs.get("PDL"))}
        except Exception as e:        # the compiler's message, for the assertion below
            found[name] = {"error": f"{type(e).__name__}: {str(e)[-2000:]}"}
    return found


@pytest.fixture(scope="module")
def compiled() -> dict:
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(root)}
    code = "import json; from tests.test_hopper_compile import compile_all; print(json.dumps(compile_all()))"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_compiles_for_hopper(compiled, name):
    result = compiled[name]
    assert "error" not in result, result.get("error")
    assert result["sm_90"]
    if result["pdl"]:                  # the dependent launch is in the code, not compiled away
        assert result["griddepcontrol"]
