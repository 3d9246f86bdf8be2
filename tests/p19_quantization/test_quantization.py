"""p19_quantization: W8A8 and FP8 Linears. The quantizers' round trips, the int8 GEMM against a
float reference within its error bound, the Triton kernels in the interpreter, the smoothing
identity, the engine's tokens against a fake-quantized HF model (tests/p19_quantization/
fake_quant.py) on tiny-llama and on the real SmolLM2, and bad settings refused."""
import functools
import importlib

import pytest
import torch

from common.sampling import SamplingParams
from tests.interpreted import run_interpreted
from tests.reference import prompts_for, real_pool

from .fake_quant import hf_quantized

PHASE = "p19_quantization"
quant = importlib.import_module(f"phases.{PHASE}.quant")
smoothing = importlib.import_module(f"phases.{PHASE}.smoothing")
LLM = importlib.import_module(f"phases.{PHASE}").LLM
config = importlib.import_module(f"phases.{PHASE}.config")
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
CPU = dict(device="cpu", dtype="float32", detokenize=False)


def awkward(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random rows with an outlier channel (LLM activations have a few) and a zero row."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[:, 3] *= 50
    x[-1] = 0
    return x


def test_int8_round_trip_is_within_half_a_step():
    x = awkward(7, 300)
    q, scale = quant.quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (7, 1) and q.abs().max() <= 127
    assert ((quant.dequantize(q, scale) - x).abs() <= scale / 2 * (1 + 1e-6)).all()
    assert (q[-1] == 0).all() and torch.isfinite(scale).all()                    # a zero row: zeros, no NaN


def test_fp8_round_trip_keeps_three_mantissa_bits():
    x = awkward(7, 300)
    q, scale = quant.quantize_fp8(x)
    assert q.dtype == torch.float8_e4m3fn
    err = (quant.dequantize(q, scale) - x).abs()
    # e4m3: a relative step of 2^-3 (half of it by rounding), and subnormal steps of 2^-9 * scale
    assert (err <= x.abs() / 16 + scale * 2 ** -9).all()


@pytest.mark.parametrize("M", [1, 5, 33])
def test_int8_matmul_is_exact_and_within_its_error_bound(M):
    """_int_mm's int32 sums equal the dequantized product's (float64); that product's distance to
    the float one is bounded by the rounding of each factor: |dx| <= sx/2, |dW| <= sw/2."""
    x, w, bias = awkward(M, 200, 1), torch.randn(70, 200) / 14, torch.randn(70)
    xq, sx = quant.quantize_int8(x)
    layer = quant.QuantLinear(w, bias, fp8=False)
    got = layer(x).double()
    wq, sw = layer.weight, layer.weight_scale.view(-1, 1)
    exact = quant.dequantize(xq, sx).double() @ quant.dequantize(wq, sw).double().t() + bias.double()
    assert torch.allclose(got, exact, rtol=1e-6, atol=1e-6 * exact.abs().max().item())
    bound = x.abs().double() @ (sw.double().t() / 2).expand(200, -1) + (sx.double() / 2) @ w.abs().double().sum(1)[None] \
        + 200 * (sx.double() / 2) * (sw.double().t() / 2)
    assert ((got - (x.double() @ w.double().t() + bias.double())).abs() <= bound * (1 + 1e-5) + 1e-6).all()


def test_fp8_matmul_is_the_dequantized_product():
    x, w = awkward(9, 128, 2), torch.randn(48, 128) / 11
    layer = quant.QuantLinear(w, None, fp8=True)
    xq, sx = quant.quantize_fp8(x)
    ref = quant.dequantize(xq, sx).double() @ quant.dequantize(layer.weight, layer.weight_scale.view(-1, 1)).double().t()
    assert torch.allclose(layer(x).double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


# One of each decode kernel, in tiles small enough that tiny shapes take several of them: N and K
# not multiples of the tiles, a K cut into slices whose last is short (K = 300 in 3: 128, 128, 44)
# or empty (K = 100 in 3: 64, 36, none), GEMV tiles 4 and 8 wide (the tensor cores' least is 16).
DECODE_VARIANTS = [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, num_warps=4, num_stages=2),
                   dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, SPLIT_K=3, num_warps=4, num_stages=2),
                   dict(kernel="gemv", BLOCK_N=4, BLOCK_K=64, num_warps=4, num_stages=1),
                   dict(kernel="gemv", BLOCK_N=8, BLOCK_K=64, SPLIT_K=3, num_warps=4, num_stages=1)]
# The quantizing GEMV's (M, N, K, bias?, zero row?): K = 300 in slices 128, 128, 44, K = 100 in 64, 36, none
QUANTIZING_CHECK = [(1, 21, 300, False, False), (2, 13, 100, True, True), (3, 21, 300, True, False),
                    (4, 13, 100, False, True)]
INTERPRETED = f"""
import json
import torch
from phases.{PHASE} import kernel_bench
kernel_bench.CHECK_SHAPES = [(1, 77, 300), (17, 40, 96)]
kernel_bench.DECODE_CHECK = [((1, 37, 300), (False, True)), ((3, 21, 100), (True, False)),
                             ((16, 20, 300), (False, False))]
kernel_bench.CANDIDATES = {{kernel_bench.tile_name(c): c for c in {DECODE_VARIANTS!r}}}
kernel_bench.QUANTIZING_CHECK = {QUANTIZING_CHECK!r}
torch.manual_seed(0)
print(json.dumps(kernel_bench.check("cpu")))
"""


@functools.cache
def interpreted_checks() -> list[dict]:
    """kernel_bench.check on CPU, once a process: the quantizer, the GEMM's rule and DECODE_VARIANTS."""
    return run_interpreted(INTERPRETED)


def test_triton_quantizer_and_gemm_in_the_interpreter():
    """triton_int8.py on CPU: the quantizer bit for bit, the GEMM against int64 sums (kernel_bench.check)."""
    failed = [c["setting"] for c in interpreted_checks() if not c["ok"]]
    assert not failed, failed


@pytest.mark.parametrize("variant", DECODE_VARIANTS,
                         ids=lambda c: f"{c.get('kernel', 'dot')}-split{c.get('SPLIT_K', 1)}")
def test_decode_variants_equal_the_exact_sums(variant):
    """Split-K and the GEMV beside the tile: int8 equal to int64 sums + torch's epilogue, bit for bit
    (int32 partial sums add exactly; the scales multiply the whole sum, once), e4m3 within the bf16
    output's rounding, at M = 1, 3, 16 (the GEMV: up to 4), with and without a bias."""
    runs = [c for c in interpreted_checks() if c["setting"].get("tile") == variant]
    rows = {1, 3} if variant.get("kernel") == "gemv" else {1, 3, 16}
    assert {(c["setting"]["M"], c["setting"]["bias"], c["setting"]["fp8"]) for c in runs} == \
        {(M, bias, fp8) for M in rows for bias in (False, True) for fp8 in (False, True)}
    for c in runs:
        err = c["metrics"]["max_err_frac"]
        assert (err < 1e-2 if c["setting"]["fp8"] else err == 0.0), c


def test_the_quantizing_gemv_equals_quantize_rows_then_the_gemv():
    """The GEMV that quantizes its float rows itself (o's input at decode): bit for bit what
    quantize_rows then the GEMV give, at M = 1..4, int8 and e4m3, one slice of K and three (the
    scales written for the sum kernel), with and without a bias, a zero row among the rows."""
    runs = [c for c in interpreted_checks() if c["setting"].get("quantizing_gemv")]
    assert {(c["setting"]["M"], c["setting"]["fp8"], c["setting"]["config"].get("SPLIT_K", 1)) for c in runs} == \
        {(M, fp8, split) for M in (1, 2, 3, 4) for fp8 in (False, True) for split in (1, 3)}
    assert {(c["setting"]["bias"], c["setting"]["zero_row"]) for c in runs} >= \
        {(False, True), (True, True), (True, False)}
    assert all(c["metrics"]["exact"] and c["ok"] for c in runs), [c for c in runs if not c["metrics"]["exact"]]


def test_decode_table_takes_a_shape_before_the_rule(monkeypatch):
    """gemm_config: DECODE_TABLE's entry for (N, K), the first bound at or above M; the rule for
    another shape, past the last bound, and above M = 16."""
    triton_int8 = importlib.import_module(f"phases.{PHASE}.triton_int8")
    gemv, split = DECODE_VARIANTS[2], DECODE_VARIANTS[1]
    rule = {(M, K): triton_int8.gemm_config(M, 64, K) for M, K in ((8, 256), (32, 256), (1, 512))}
    monkeypatch.setattr(triton_int8, "DECODE_TABLE", {(64, 256): ((1, gemv), (4, split))})
    assert triton_int8.gemm_config(1, 64, 256) == gemv
    assert triton_int8.gemm_config(2, 64, 256) == triton_int8.gemm_config(4, 64, 256) == split
    assert {(M, K): triton_int8.gemm_config(M, 64, K) for M, K in rule} == rule
    triton_int8.gemm_config(1, 64, 256)["BLOCK_N"] = 0                 # a copy: the table stays as it was
    assert triton_int8.DECODE_TABLE[(64, 256)][0][1] == gemv


def logits_of(llm, tokens):
    """Teacher-forced logits of every position (the bench's accuracy path)."""
    return importlib.import_module(f"phases.{PHASE}.bench").teacher_forced_logits(llm, tokens)


def test_smoothing_leaves_the_float_model_unchanged():
    """x W^T = (x / s)(W * s)^T: folded into the norm and the weights, the float model's logits
    move only by fp32 rounding, while the weights did change."""
    llm = LLM("tiny-llama", **CPU)
    tokens = prompts_for("tiny-llama")[1]
    before = logits_of(llm, tokens)
    qkv = llm.model.layers[0].attn.qkv_proj.weight.clone()
    amax = smoothing.activation_amax(llm.model, llm.runner.backend, smoothing.calibration_tokens(
        llm.tokenizer, llm.model_config.vocab_size))
    smoothing.smooth(llm.model, amax)
    assert not torch.allclose(llm.model.layers[0].attn.qkv_proj.weight, qkv)
    after = logits_of(llm, tokens)
    assert (after - before).abs().max() <= 1e-4 * before.abs().max()


def test_linears_are_quantized_and_the_rest_is_not():
    llm = LLM("tiny-llama", quantization="w8a8", **CPU)
    layer = llm.model.layers[0]
    for linear in (layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert isinstance(linear, quant.QuantLinear) and linear.weight.dtype == torch.int8
    assert llm.model.embed.weight.dtype == llm.model.lm_head.weight.dtype == torch.float32


def test_the_pool_is_sized_after_quantizing(monkeypatch):
    """The KV pool takes the memory the weights leave: sized after the Linears are int8, so the
    bytes quantizing frees become blocks (on a GPU, where the budget is what is free)."""
    seen, build = [], LLM._build_cache

    def spy(self):
        seen.append(all(isinstance(m, quant.QuantLinear) for m in (self.model.layers[0].mlp.down_proj,
                                                                    self.model.layers[0].attn.o_proj)))
        return build(self)
    monkeypatch.setattr(LLM, "_build_cache", spy)
    LLM("tiny-llama", quantization="fp8", **CPU)
    assert seen == [True]


def assert_reference_tokens(preset: str, mode: str, llm, prompts, near_tie: float = 0.0) -> None:
    """Each greedy token is the fake-quantized model's argmax, read teacher-forced: the prompt and
    the engine's tokens in one forward. Not HF's generate: its incremental decode differs from its
    own whole-sequence forward in the last bits, and so does a decode of ours (attention over
    another length). A quantized model is exact only against the same float path: 1e-7 upstream
    flips an int8 rounding, one step is ~1% of a row, and SmolLM2's last layers (outliers of ~700)
    grow that into logits moved by ~0.5, the quantization noise itself. So a deep model may pick
    the runner-up where the reference's two best logits are within `near_tie` (tiny-llama: 0)."""
    ref = hf_quantized(preset, mode)
    for prompt, out in zip(prompts, llm.generate(prompts, GREEDY)):
        with torch.inference_mode():
            logits = ref(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1:-1]
        chosen = logits.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        assert (logits.max(-1).values - chosen <= near_tie).all(), (logits.argmax(-1).tolist(), out.token_ids)


@pytest.mark.parametrize("mode", ["w8a8", "w8a8-nosmooth", "fp8"])
def test_engine_gives_the_fake_quantized_models_tokens(mode):
    assert_reference_tokens("tiny-llama", mode, LLM("tiny-llama", quantization=mode, **CPU), prompts_for("tiny-llama")[:3])


def test_real_model_runs_w8a8_end_to_end(real_prompts):
    """SmolLM2 in W8A8, calibrated and smoothed at start, batched: its tokens (up to near ties), and
    its teacher-forced logits the fake-quantized model's bit for bit (one prefill: HF's float path)."""
    llm = LLM("smollm2-135m", quantization="w8a8", **CPU, **real_pool(PHASE))
    assert_reference_tokens("smollm2-135m", "w8a8", llm, real_prompts[1:3], near_tie=1.0)
    ref = hf_quantized("smollm2-135m", "w8a8")
    with torch.inference_mode():
        want = ref(torch.tensor([real_prompts[2]])).logits[0, :-1]
    assert torch.equal(logits_of(llm, real_prompts[2]), want)


def test_bad_quantization_is_refused_with_the_choices(monkeypatch):
    with pytest.raises(ValueError, match="'w8a8', 'w8a8-nosmooth', 'fp8'"):
        config.EngineConfig(model="tiny-llama", device="cpu", quantization="int4")
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        config.EngineConfig(model="tiny-llama", device="cpu", quantization="fp8")


def test_tensor_parallel_engine_runs_quantized():
    """Two ranks (gloo), each quantizing its slices, the smoothing factors agreed over both: the
    prompts' first tokens are one rank's (o's and down's inputs are then quantized per rank's slice,
    so later tokens may part: README)."""
    prompts, greedy = prompts_for("tiny-llama")[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    one = [o.token_ids for o in LLM("tiny-llama", quantization="w8a8", **CPU).generate(prompts, greedy)]
    llm = LLM("tiny-llama", quantization="w8a8", tensor_parallel_size=2, **CPU)
    try:
        two = [o.token_ids for o in llm.generate(prompts, greedy)]
    finally:
        llm.shutdown()
    assert [t[0] for t in two] == [t[0] for t in one] and all(len(t) == 4 for t in two)


def test_graph_lanes_leave_each_requests_tokens():
    """A replayed decode step runs its bucket's padded lanes too (cuda_graph.py; here its CPU
    stand-in, eager): each row is quantized with its own scale, so padding changes no real row."""
    graphs = importlib.import_module(f"phases.{PHASE}.cuda_graph")
    prompts = prompts_for("tiny-llama")[:3]
    want = [o.token_ids for o in LLM("tiny-llama", quantization="w8a8", **CPU).generate(prompts, GREEDY)]
    llm = LLM("tiny-llama", quantization="w8a8", max_num_seqs=4, **CPU)
    llm.runner.graphs = graphs.GraphRunner(llm.model, llm.cache, llm.runner.backend, graphs.buckets_up_to(4),
                                           width=-(-llm.max_model_len // llm.cache.block_size),
                                           scratch_block=llm.cache.scratch_block, capture=False)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == want
