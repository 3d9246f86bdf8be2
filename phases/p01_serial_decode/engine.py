"""LLM: the engine. Serial decode: one request at a time, prefill then one token per step."""
from __future__ import annotations

import time
from typing import Callable

import torch
from tqdm import tqdm

from common.loader import resolve
from common.output import Output
from common.requests import prepare_requests
from common.weights import skip_init

from .config import EngineConfig
from .kv_cache import KVCache
from .model import Model
from .sampler import make_generator, sample
from .sequence import Sequence


class LLM:
    """LLM(model, **engine_options).generate(prompts, sampling_params) -> list[Output]."""

    def __init__(self, model: str = "smollm2-135m", *, detokenize: bool = True, **options):
        self.config = EngineConfig(model=model, **options)
        self.source = resolve(self.config.model, seed=self.config.seed)
        self.model_config = self.source.config
        self.max_model_len = self.config.resolve_max_model_len(self.model_config.max_position)
        self.detokenize = detokenize
        self.device, self.dtype = self.config.device, self.config.torch_dtype
        self.model = self._build_model()
        torch.manual_seed(self.config.seed)

    def _build_model(self) -> Model:
        with torch.device(self.device), skip_init():     # load_weights() fills every parameter
            model = Model(self.model_config).to(self.dtype)
        model.load_weights(self.source.load_weights(self.device, self.dtype))
        return model.eval()

    @property
    def tokenizer(self):
        return self.source.tokenizer

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = False,
                 on_token: Callable[[list[int]], None] | None = None) -> list[Output]:
        """prompts: a str, a list of token ids, or a list of either. Outputs keep their order.
        on_token(output ids so far) runs after every token but a request's last: a serial engine's
        way to stream (later phases have a step API instead)."""
        requests = prepare_requests(prompts, sampling_params, self._encode,
                                    self.model_config.vocab_size, self.max_model_len, self.detokenize)
        now = time.perf_counter()   # offline: every request arrives now
        seqs = [Sequence(i, ids, p, now) for i, (ids, p) in enumerate(requests)]
        for seq in tqdm(seqs, disable=not use_tqdm, desc="requests"):
            self._run(seq, on_token)
        return [self._output(seq) for seq in seqs]

    @torch.inference_mode()
    def _run(self, seq: Sequence, on_token=None) -> None:
        """Prefill the prompt, then decode one token per forward until the request finishes."""
        cache = KVCache(self.model_config, seq.max_len, self.device, self.dtype)
        generator = make_generator(seq.params, self.device)
        tokens = torch.tensor(seq.prompt_ids, device=self.device)
        start = 0
        while True:
            logits = self.model(tokens, start, cache)               # (vocab,) for the last token
            next_token = sample(logits, seq.params, generator)      # (1,), on the device
            seq.append(next_token.item(), time.perf_counter(),      # .item(): host sync
                       self.source.eos_token_ids, self._detokenize)
            if seq.finished:
                return
            if on_token:
                on_token(seq.output_ids)
            start += tokens.shape[0]
            tokens = next_token

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def _detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.detokenize else ""

    def _output(self, seq: Sequence) -> Output:
        text = seq.stop_text if seq.stop_text is not None else self._detokenize(seq.output_ids)
        return Output(seq.prompt_ids, seq.output_ids, text, seq.finish_reason,
                      seq.arrival_time, seq.token_times)
