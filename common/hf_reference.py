"""HuggingFace transformers as the reference (exact-match tests) and as the baseline (benchmarks).

`HFEngine` has the same generate() API as the phase engines, so the bench harness drives both.
engine "hf-generate": eager `model.generate` with the default dynamic cache.
engine "hf-static":   `cache_implementation="static"`, which makes generate() compile the forward.
engine "hf-generate-nocudnn": "hf-generate" with cuDNN's attention kernel ruled out (common.engines).
"""
from __future__ import annotations

import contextlib
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.streamers import BaseStreamer

from .device import check_device, default_device, default_dtype, parse_dtype, synchronize
from .loader import ModelSource, resolve
from .output import Output
from .requests import prepare_requests
from .weights import ours_to_hf


def build_hf_model(source: ModelSource, device: str, dtype: torch.dtype):
    """The transformers model with the same weights our engines load."""
    if source.hf_dir is not None:
        model = AutoModelForCausalLM.from_pretrained(str(source.hf_dir), dtype=dtype).to(device)
    else:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(source.hf_config, dtype=dtype)
        missing, unexpected = model.load_state_dict(ours_to_hf(source.load_weights(device, dtype)), strict=False)
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise RuntimeError(f"weight names do not match: missing={missing} unexpected={unexpected}")
    # generate() fills every None in the GenerationConfig we pass from the model's own defaults,
    # so eos_token_id=None would silently mean "stop at the checkpoint's EOS". Clear the default:
    # callers pass the EOS ids they want (none when EOS is ignored).
    model.generation_config.eos_token_id = None
    return model.eval()


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy ids from HF generate, one prompt at a time (no padding), EOS ignored."""
    device = next(model.parameters()).device
    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=None, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    outputs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids], device=device)
            out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
            outputs.append(out[0, len(ids):].tolist())
    return outputs


class _TokenClock(BaseStreamer):
    """Records when each generation step's tokens are ready (generate() calls put() per step)."""

    def __init__(self, device: str):
        self.device, self.times, self.seen_prompt = device, [], False

    def put(self, value):
        if not self.seen_prompt:          # the first put() carries the prompt
            self.seen_prompt = True
            return
        synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self):
        pass


class HFEngine:
    """Baseline engine over transformers generate(); batch_size > 1 pads (left) and batches."""

    def __init__(self, model: str = "smollm2-135m", *, mode: str = "eager", device: str | None = None,
                 dtype: str | None = None, batch_size: int = 1, seed: int = 0, detokenize: bool = True,
                 cudnn_attention: bool = True):
        if mode not in ("eager", "static"):
            raise ValueError(f"mode must be 'eager' or 'static', got {mode!r}")
        self.device = check_device(device or default_device())
        self.dtype = parse_dtype(dtype or default_dtype(self.device))
        self.source = resolve(model, seed=seed)
        self.model = build_hf_model(self.source, self.device, self.dtype)
        self.mode, self.batch_size, self.detokenize = mode, batch_size, detokenize
        self.cudnn_attention = cudnn_attention

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = False) -> list[Output]:
        cfg = self.source.config
        requests = prepare_requests(prompts, sampling_params, lambda text: self.source.tokenizer.encode(text),
                                    cfg.vocab_size, cfg.max_position)
        # Every request arrives now, as in the engines: a later batch's wait counts in its TTFT.
        arrival = time.perf_counter()
        outputs = []
        for i in range(0, len(requests), self.batch_size):
            outputs += self._generate_batch(requests[i:i + self.batch_size], arrival)
        return outputs

    @torch.inference_mode()
    def _generate_batch(self, requests, arrival: float) -> list[Output]:
        params = requests[0][1]
        if params.stop or any(p != params for _, p in requests[1:]):
            raise ValueError("the HF baseline takes one SamplingParams per batch and no stop strings")
        ids, mask = self._left_pad([r[0] for r in requests])
        clock = _TokenClock(self.device)
        with self._attention_backends():
            out = self.model.generate(ids, attention_mask=mask, generation_config=self._config(requests),
                                      streamer=clock)
        return [self._output(prompt, p, out[row, ids.shape[1]:].tolist(), arrival, clock.times)
                for row, (prompt, p) in enumerate(requests)]

    def _attention_backends(self):
        """Every SDPA backend, or all but cuDNN's (which plans per new shape)."""
        if self.cudnn_attention:
            return contextlib.nullcontext()
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _left_pad(self, prompts: list[list[int]]):
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    def _config(self, requests) -> GenerationConfig:
        p = requests[0][1]
        eos = None if p.ignore_eos else self.source.eos_token_ids or None
        kw = dict(max_new_tokens=max(q.max_tokens for _, q in requests), eos_token_id=eos,
                  pad_token_id=0, do_sample=not p.greedy)
        if not p.greedy:
            kw |= dict(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k or None)
        if self.mode == "static":
            kw["cache_implementation"] = "static"
        return GenerationConfig(**kw)

    def _output(self, prompt, p, new_ids, arrival, times) -> Output:
        new_ids = new_ids[:p.max_tokens]
        eos = self.source.eos_token_ids
        reason = "length"
        if not p.ignore_eos:
            hit = [i for i, t in enumerate(new_ids) if t in eos]
            if hit:
                new_ids, reason = new_ids[:hit[0] + 1], "stop"
        text = self.source.tokenizer.decode(new_ids) if self.detokenize else ""
        return Output(prompt, new_ids, text, reason, arrival, times[:len(new_ids)])
