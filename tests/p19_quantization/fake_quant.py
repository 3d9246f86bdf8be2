"""The reference a quantized engine is held to: HF's model (fp32, CPU) with the same quantization
applied in plain torch, written apart from the engine's code.

HF's own tokens cannot be that reference: quantization changes the arithmetic on purpose. So each
of q/k/v/o/gate/up/down becomes a fake-quantized Linear: the weight rounded to int8 (or e4m3) per
output row, the input per token, the products summed in float64 (every partial sum of int8
products is an integer below 2^53: exact, as the engine's int32), the two scales applied in fp32.
"w8a8" first smooths q/k/v and gate/up from the calibration text, each chunk of CHUNK tokens
prefilled from position 0, the factors folded into the norm before them, as smoothing.py says.
"""
from __future__ import annotations

import torch
from torch import nn

from common.hf_reference import build_hf_model
from common.loader import resolve
from common.texts import calibration_text

CHUNK, ALPHA = 256, 0.5


def rows_quantized(x: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, K) -> (values as float, integers or e4m3 values; scales (R, 1)), one scale per row."""
    x = x.float()
    top = 448.0 if fp8 else 127.0
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / top
    y = (x / scale).clamp(-top, top)
    return (y.to(torch.float8_e4m3fn).float() if fp8 else y.round()), scale


class FakeQuantLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fp8: bool):
        super().__init__()
        self.fp8, self.bias = fp8, bias
        self.q, self.scale = rows_quantized(weight, fp8)               # (N, K), (N, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xq, xs = rows_quantized(x.reshape(-1, shape[-1]), self.fp8)
        acc = (xq.double() @ self.q.double().t()).float()              # exact sums, then one rounding
        y = acc * xs * self.scale.view(1, -1)
        y = y if self.bias is None else y + self.bias.float()
        return y.view(*shape[:-1], -1).to(x.dtype)


def hf_quantized(preset: str, mode: str):
    """The HF model of `preset`, fp32, with `mode` ("w8a8", "w8a8-nosmooth", "fp8") applied."""
    source = resolve(preset)
    model = build_hf_model(source, "cpu", torch.float32)
    if mode == "w8a8":
        ids = [t % source.config.vocab_size for t in source.tokenizer.encode(calibration_text())]
        smooth(model, input_amax(model, ids))
    for layer in model.model.layers:
        for block, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                             (layer.mlp, ("gate_proj", "up_proj", "down_proj"))):
            for name in names:
                linear = getattr(block, name)
                setattr(block, name, FakeQuantLinear(linear.weight.detach().float(), linear.bias, mode == "fp8"))
    return model


@torch.inference_mode()
def input_amax(model, ids: list[int]) -> list[list[torch.Tensor]]:
    """Per layer: max |x_j| into q_proj and into gate_proj over the calibration chunks."""
    found = [[None, None] for _ in model.model.layers]

    def hook(slot, i):
        def record(module, args):
            amax = args[0].reshape(-1, args[0].shape[-1]).abs().amax(dim=0)
            slot[i] = amax if slot[i] is None else torch.maximum(slot[i], amax)
        return record
    handles = [h for layer, slot in zip(model.model.layers, found) for h in (
        layer.self_attn.q_proj.register_forward_pre_hook(hook(slot, 0)),
        layer.mlp.gate_proj.register_forward_pre_hook(hook(slot, 1)))]
    for start in range(0, len(ids), CHUNK):
        model(torch.tensor([ids[start:start + CHUNK]]))
    for h in handles:
        h.remove()
    return found


@torch.no_grad()
def smooth(model, amax) -> None:
    for layer, (attn_x, mlp_x) in zip(model.model.layers, amax):
        pairs = ((layer.input_layernorm, attn_x, [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                 (layer.post_attention_layernorm, mlp_x, [layer.mlp.gate_proj, layer.mlp.up_proj]))
        for norm, x_amax, linears in pairs:
            w_amax = torch.cat([lin.weight for lin in linears]).abs().amax(dim=0)
            s = (x_amax.clamp(min=1e-5).pow(ALPHA) / w_amax.clamp(min=1e-5).pow(1 - ALPHA)).clamp(min=1e-5)
            norm.weight.div_(s)
            for lin in linears:
                lin.weight.mul_(s)
