"""p19's profile parts: profile-pair-8b is profile-pair on llama-8b at batch 1, through
common.profile_pair's shape override (the default keeps SHAPES's preset and batch sizes)."""
import importlib
import json

PHASE = "p19_quantization"

bench = importlib.import_module(f"phases.{PHASE}.bench")
profile_pair = importlib.import_module("common.profile_pair")


def test_profile_pair_8b_is_llama_8b_at_batch_1_on_a_gpu(monkeypatch):
    """Every mode, one engine at a time (profile_part builds them in turn: fp8 fits beside nothing);
    the llama-1b part keeps SHAPES's; no 8b part on a CPU."""
    calls = []
    monkeypatch.setattr(bench, "profile_part", lambda *args: lambda rest, command: calls.append(args))
    for name in ("profile-pair", "profile-pair-8b"):
        bench.GPU_PARTS[name](["--device", "cpu"], f"make phase-19 bench PART={name}")
    (_, engines, name, shape), (_, engines_8b, name_8b, shape_8b) = calls
    assert (name, shape, name_8b, shape_8b) == ("profile-pair", None, "profile-pair-8b", ("llama-8b", [1]))
    assert engines == engines_8b and [options.get("quantization") for _, options in engines][:2] == [None, "w8a8"]
    assert "profile-pair-8b" not in bench.CPU_PARTS


def test_profile_part_takes_a_preset_and_batch_sizes(tmp_path, monkeypatch):
    """shape=(preset, batch sizes) in place of SHAPES's, the part's name in every record."""
    monkeypatch.setattr(profile_pair, "RESULTS", tmp_path)
    part = profile_pair.profile_part(PHASE, [(PHASE[:3], {})], "profile-pair-x", ("tiny-llama", [2]))
    part(["--device", "cpu"], "make phase-19 bench PART=profile-pair-x")
    records = json.loads((tmp_path / PHASE / "profile-pair-cpu.json").read_text())
    assert [(r["preset"], r["setting"]["batch"], r["part"]) for r in records] == [("tiny-llama", 2, "profile-pair-x")]


O_VARIANTS = f"""
import json
import torch
from phases.{PHASE} import kernel_bench, quant
torch.manual_seed(0)
w = torch.randn(2048, 2048) / 45
copies = [kernel_bench.Weights(w.bfloat16(), quant.QuantLinear(w, None, fp8=False), None)]
calls = kernel_bench.o_variants("o", 1, 2048, 2048, "cpu", copies)
others = [kernel_bench.o_variants(*shape, "cpu", copies) for shape in (("qkv", 1, 3072, 2048), ("o", 4, 2048, 2048))]
print(json.dumps({{"names": list(calls), "bytes": [b for _, b in calls.values()], "others": others}}))
"""


def test_the_gemm_bench_times_o_quantizing_its_input_at_batch_1():
    """llama-1b's o at M = 1 (DECODE_TABLE's GEMV): quantize_rows + the GEMV against the quantizing
    GEMV, each reading the weight's N x K bytes; no such pair at another shape or M (their rule is
    not the GEMV). That the two give the same output bit for bit is test_quantization's (the
    interpreter runs a 2048 x 2048 GEMV for seconds: not again here)."""
    from tests.interpreted import run_interpreted
    got = run_interpreted(O_VARIANTS)
    assert got == {"names": ["quantize then gemv int8", "gemv quantizing int8"], "bytes": [2048 * 2048] * 2,
                   "others": [{}, {}]}


def test_fusion_saves_sums_every_fused_pair(capsys):
    """The layer table's "fusion saves": the norm's, SiLU * up's and o's GEMV's separate kernels
    against their fused one, summed (2 + 1 + 1.5 us)."""
    kernel_bench = importlib.import_module(f"phases.{PHASE}.kernel_bench")
    us = {"bf16": 20.0, "norm then quantize int8": 5.0, "norm quantizing int8": 3.0, "silu*up then quantize int8": 4.0,
          "silu*up quantizing int8": 3.0, "quantize then gemv int8": 8.0, "gemv quantizing int8": 6.5}
    kernel_bench.layer_table([{"workload": "gemm", "preset": "llama-1b", "setting": {"M": 1}, "engine": name,
                               "metrics": {"us": t}} for name, t in us.items()], ["llama-1b"])
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| llama-1b | 1 |")]
    assert row and row[0].rstrip(" |").split("| ")[-1] == "4.5"
