"""common.kernel_map on a synthetic chrome trace: kernels summed by class, per decode step."""
import gzip
import json

import pytest

from common import kernel_map

# Two decode steps of a one-layer model, named as the H200 traces name them.
KERNELS = [
    ("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT", 10.0),                       # qkv
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", 1.0),
    ("_paged_decode_kernel", 6.0),                                           # our Triton kernel
    ("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90", 4.0),             # FlashAttention 4
    ("void at::native::vectorized_layer_norm_kernel<c10::BFloat16, float>", 2.0),
    ("_rope_store_kernel", 1.0),
    ("void at::native::index_elementwise_kernel<128, 4, index_copy_kernel_impl>", 1.0),   # K/V write
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add>", 1.0),
    ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>", 2.0),  # a copy, not math
    ("void at::native::reduce_kernel<512, 1, ArgMaxOps<float>>", 1.0),
    ("Memcpy HtoD (Pinned -> Device)", 1.0),
    ("some_new_kernel", 0.0),
]


def write_trace(path, kernels, steps):
    events = [{"name": n, "cat": "kernel" if not n.startswith("Memcpy") else "gpu_memcpy", "dur": us}
              for _ in range(steps) for n, us in kernels]
    events.append({"name": "aten::mm", "cat": "cpu_op", "dur": 99.0})        # host events are not GPU time
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_kernels_are_summed_by_class_per_step(tmp_path):
    write_trace(tmp_path / "trace.json.gz", KERNELS, steps=2)
    m = kernel_map.step_map(kernel_map.read_kernels(tmp_path / "trace.json.gz"), steps=2)
    assert m["GEMM"] == pytest.approx({"us": 11.0, "count": 2.0, "share": 11 / 30})
    assert m["attention"]["us"] == 10.0 and m["attention"]["count"] == 2.0     # FA4's CUTLASS kernel too
    assert m["rotary + K/V write"]["us"] == 2.0                               # rope_store and index_copy
    assert m["copies"]["us"] == 3.0 and m["elementwise"]["us"] == 1.0
    assert m["norm"]["us"] == 2.0 and m["sampling"]["us"] == 1.0 and m["other"]["count"] == 1.0
    assert sum(row["share"] for row in m.values()) == pytest.approx(1.0)


def test_table_reads_each_records_trace_and_says_the_floor(tmp_path):
    (tmp_path / "p14_x").mkdir()
    write_trace(tmp_path / "p14_x" / "trace-h200-b1.json.gz", KERNELS, steps=3)
    rec = {"phase": "p14_x", "preset": "llama-1b", "setting": {"batch": 1}, "trace": "trace-h200-b1.json.gz",
           "metrics": {"steps": 3, "ideal_ms_per_step": 0.02}}
    rows = kernel_map.table([rec, rec | {"trace": None}], root=tmp_path).splitlines()
    assert rows[0] == "| kernel class | llama-1b batch 1: µs/step (kernels, share) |"  # no trace: no column
    assert "| GEMM | 11 (2, 37%) |" in rows and rows[-1] == "| floor (weights + KV once) | 20 µs |"
    assert kernel_map.table([rec | {"trace": None}], root=tmp_path).startswith("_No profile trace yet")
    with pytest.raises(ValueError, match="steps"):
        kernel_map.step_map([], steps=0)
