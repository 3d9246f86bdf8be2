"""SmoothQuant's smoothing: move the activations' outliers into the weights before quantizing.

An LLM's activations have a few channels hundreds of times larger than the rest, the same channels
in every token. Quantized per token, such a row spends its 255 levels on the outlier and rounds
the other channels to a handful of values. Weights have no such channels. So scale input channel j
down by s_j in the activation and up by s_j in the weight: the product is unchanged,

    y = x W^T = (x / s) (W * s)^T,     s_j = max|x_j|^alpha / max_i |W_ij|^(1 - alpha), alpha = 1/2,

and both factors now have channel ranges of similar size (the geometric mean of the two). x / s
costs nothing at run time: x is an RMSNorm's output, norm(h) * g, so g / s is the norm's new
weight. That is why only the Linears behind a norm are smoothed: q/k/v (attn_norm) and gate/up
(mlp_norm). o and down are fed by attention and by SiLU * up, where no weight can take the factor
for free; they are quantized as they are (and so are MLA's projections: quant.py).

max|x_j| comes from calibration: a short text (different from any text accuracy is measured on)
run through the float model once at start; max_i |W_ij| over every output row, every rank's.
"""
from __future__ import annotations

import torch

from common.sampling import SamplingParams
from common.texts import calibration_text

from .kv_cache import KVCache
from .model import Model
from .model_runner import ModelRunner
from .scheduler import StepPlan
from .sequence import Sequence

ALPHA = 0.5
SMOOTHED = (("attn_norm", "attn", "qkv_proj"), ("mlp_norm", "mlp", "gate_up_proj"))   # norm -> the Linear it feeds
CHUNK = 256                                # calibration tokens a forward (a fixed size: the same factors in any engine)
BLOCK = 16


def calibration_tokens(tokenizer, vocab_size: int) -> list[int]:
    """The calibration text's ids (a random preset with a smaller vocabulary takes them modulo it)."""
    return [t % vocab_size for t in tokenizer.encode(calibration_text())]


@torch.inference_mode()
def activation_amax(model: Model, backend, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (max |x_j| into q/k/v, max |x_j| into gate/up), each (hidden,) fp32: the float
    model prefills the tokens in chunks of CHUNK, each a sequence of its own in a pool of its own."""
    found = [[None, None] for _ in model.layers]
    hooks = [getattr(getattr(layer, block), name).register_forward_pre_hook(record(found[i], j))
             for i, layer in enumerate(model.layers) for j, (_, block, name) in enumerate(SMOOTHED)
             if hasattr(getattr(layer, block), name)]             # (MLA: no q/k/v Linear, its gate/up only)
    try:
        chunk = min(CHUNK, model.cfg.max_position)
        cache = KVCache(model.cfg, -(-chunk // BLOCK), BLOCK, model.embed.weight.device, model.embed.weight.dtype)
        runner = ModelRunner(model, cache, str(model.embed.weight.device), backend)
        for start in range(0, len(tokens), chunk):
            runner.run(prefill_plan(tokens[start:start + chunk]))
    finally:
        for hook in hooks:
            hook.remove()
    return [tuple(pair) for pair in found]


def record(slot: list, index: int):
    def hook(module, args):
        amax = args[0].detach().abs().amax(dim=0).float()          # (hidden,) over the chunk's tokens
        slot[index] = amax if slot[index] is None else torch.maximum(slot[index], amax)
    return hook


def prefill_plan(chunk: list[int]) -> StepPlan:
    """One sequence prefilling `chunk` from position 0 into blocks 0, 1, ... of the private pool."""
    seq = Sequence(-1, chunk, SamplingParams(max_tokens=1), 0.0)
    seq.block_table, seq.num_computed_tokens = list(range(-(-len(chunk) // BLOCK))), len(chunk)
    return StepPlan(budget=len(chunk), is_prefill=True, seqs=[seq], num_new_tokens=[len(chunk)])


def smoothing_factors(x_amax: torch.Tensor, weight: torch.Tensor, tp=None) -> torch.Tensor:
    """s (K,) fp32 for a Linear's weight (N, K) (this rank's rows: the max is over every rank's)."""
    w_amax = weight.detach().abs().amax(dim=0).float()            # (K,)
    if tp is not None:                                            # (world * K,) -> max over ranks
        w_amax = tp.all_gather_last(w_amax).view(tp.world_size, -1).amax(dim=0)
    s = x_amax.clamp(min=1e-5).pow(ALPHA) / w_amax.clamp(min=1e-5).pow(1 - ALPHA)
    return s.clamp(min=1e-5)


@torch.no_grad()
def smooth(model: Model, amax: list[tuple[torch.Tensor, torch.Tensor]], tp=None) -> None:
    """Fold the factors into every smoothed pair, in place: the norm's weight / s, the Linear's
    columns * s (each product in fp32, one Linear at a time, stored in the model's dtype: a bf16
    model's smoothed weight is rounded once before it is quantized, 2^-9 against int8's 2^-7)."""
    for layer, pair in zip(model.layers, amax):
        for (norm_name, block, name), x_amax in zip(SMOOTHED, pair):
            if x_amax is None:                                        # not there (MLA's attention)
                continue
            norm, linear = getattr(layer, norm_name), getattr(getattr(layer, block), name)
            s = smoothing_factors(x_amax, linear.weight, tp)
            norm.weight.copy_((norm.weight.float() / s).to(norm.weight.dtype))
            linear.weight.copy_((linear.weight.float() * s[None, :]).to(linear.weight.dtype))   # (N, K) * (K,)
