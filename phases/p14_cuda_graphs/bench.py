"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison, the engines measured in one process, interleaved and repeated, the
previous phase built twice ("p13", "p13#2": the run's A/A control). On a GPU each part fits one
10-minute call; on a CPU the same comparison runs at small scale on tiny-llama (where there are
no graphs: the CPU parts check that the eager path is unchanged).

CUDA graphs remove the host's launch time from decode steps, so they show where the host was
the bottleneck: batch 1 (latency), 64 in flight, and the offline batch, on llama-1b and llama-8b.
Both GPU attention backends run inside the graphs: "auto" (FlashAttention 4 where installed) and
our Triton kernel. "nano-vllm" and "nano-vllm-8b" run the peer engine on the same workloads in
the same machine start (common.peer; it needs the peer's public source, see the README);
"offline-8b-peer" runs p14 alone (twice) with a pool as large as the peer's, to read beside it.
speculation: p13's speed measurement (common.spec_decode, llama-8b, batch 1, the scripted
proposer at acceptance 0.6/0.8/0.95, k = 4) with and without graphs: speculation over p13 and
over p14, in one run. p14 replays its verify steps too (k + 1 lanes a sequence), so the gain is measured again.
serving: the same engines behind their HTTP servers (p09's server, the engine in its own
process), 1 to 64 streams in flight: whether the graphs' gain reaches a served user.
profile-pair: this engine's decode step without graphs (`cuda_graph=False`, the ablation) and
with them, profiled in one process in rotated rounds (common.profile_pair): GPU idle, kernels and
host time per step, the idea itself. On a CPU both run eagerly: the part's plumbing only.
fusion(-8b): batch 1, p14 eager and unfused (its other host changes only), graphs without the
fused kernels, graphs with them: how much of the gain is the graphs and how much the fusion.
parity: where bf16 greedy tokens part from fp32's, and from each other across batch shapes, graphs,
prefix hits and verify steps, on the real SmolLM2 (common.greedy_parity: what "same tokens" means).
self-draft: the draft-model proposer at the default memory settings on llama-8b: its pool and the
target's share gpu_memory_utilization of free memory; builds, generates, and reports both pools.
"""
from __future__ import annotations

import importlib
import sys

from common import greedy_parity, peer, spec_decode
from common.bench_set import run_parts
from common.profile_pair import profile_part

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p14"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p13"
AA = [PREVIOUS, PREVIOUS + "#2"]
TRITON = f"{ENGINE} attention_backend=triton"


# p14's gain split in one run: its step eager and unfused, replayed unfused, replayed and fused.
FUSION = (f"{ENGINE} cuda_graph=0 fused_kernels=0", f"{ENGINE} fused_kernels=0", ENGINE)


def standard(workload: str, preset: str, *extra: str, engines=(ENGINE, TRITON)) -> list[list[str]]:
    return [["--workload", workload, "--presets", preset, *extra, "--engines", ",".join([*AA, *engines])]]


# Three llama-8b engines (16 GB of weights each) share the GPU: a pool sized for all 256 offline
# requests at once (~38 GB each) does not fit three times, so each engine gets 24 GiB and queues the rest.
POOL_8B = f"kv_cache_bytes={24 << 30}"


def offline_8b() -> list[list[str]]:
    engines = [f"{e} {POOL_8B}" for e in (*AA, ENGINE)]
    return [["--workload", "offline", "--presets", "llama-8b", "--engines", ",".join(engines)]]


def offline_8b_peer() -> list[list[str]]:
    """p14 alone, built twice (its own A/A), each with a pool for the whole offline set at once (the
    bench's default), as nano-vllm has: p14's offline number to read beside the peer's."""
    return [["--workload", "offline", "--presets", "llama-8b", "--engines", f"{ENGINE},{ENGINE}#2"]]


SERVED = [f"{e} server=http" for e in (*AA, ENGINE)]


def serving(preset: str, levels: str, *scale: str) -> list[list[str]]:
    return [["--workload", "concurrency", "--concurrency", levels, "--presets", preset, *scale,
             "--engines", ",".join(SERVED)]]


SPECULATION = [*AA, f"{PREVIOUS} speculative=ngram", ENGINE, f"{ENGINE} speculative=ngram"]
SPECULATION_SWEEP = ("--batches", "1", "--acceptances", "0.6,0.8,0.95", "--ks", "4")


def speculation(rest: list[str], command: str) -> None:
    """Speculation's speed with graphs (p14) and without (p13), scripted acceptance, llama-8b."""
    spec_decode.main(["speed", "--phase", PHASE, "--presets", "llama-8b", "--engines", ",".join(SPECULATION),
                      *SPECULATION_SWEEP, *rest], part="speculation", make_command=command)


speculation.preset, speculation.engines, speculation.extra = "llama-8b", SPECULATION, SPECULATION_SWEEP


def self_draft(rest: list[str], command: str) -> None:
    """llama-8b, speculative="draft", every memory setting at its default: one record."""
    import time

    import torch

    from common.results import RESULTS, device_tag, provenance, write_records
    from common.sampling import SamplingParams
    llm = importlib.import_module(f"phases.{PHASE}").LLM("llama-8b", speculative="draft")
    free_after_build = torch.cuda.mem_get_info()[0]
    prompts = [[1000 + 7 * i + j for j in range(32)] for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))     # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    c, name = llm.speculator.counters(), torch.cuda.get_device_name()
    metrics = {"num_blocks": llm.cache.num_blocks, "draft_num_blocks": llm.speculator.proposer.blocks.num_blocks,
               "free_bytes_after_build": free_after_build, "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
               "output_tok_s": sum(len(o.token_ids) for o in outs) / seconds,
               "acceptance": c["spec_decode_num_accepted_tokens"] / max(1, c["spec_decode_num_draft_tokens"])}
    record = {"phase": PHASE, "engine": ENGINE + " speculative=draft", "workload": "self-draft", "preset": "llama-8b",
              "dtype": "bfloat16", "scale": "full", "setting": {"concurrency": len(prompts)}, "device": name,
              "metrics": metrics, "provenance": provenance(name) | {"make_command": command}}
    write_records(RESULTS / PHASE / f"self-draft-{device_tag(name)}.json", [record])
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))


GPU_PARTS = {
    "latency": standard("latency", "llama-1b"),
    "latency-8b": standard("latency", "llama-8b"),
    "concurrency": standard("concurrency", "llama-1b", "--concurrency", "64"),
    "concurrency-8b": standard("concurrency", "llama-8b", "--concurrency", "64", engines=(ENGINE,)),
    "offline": standard("offline", "llama-1b", engines=(ENGINE,)),
    "offline-8b": offline_8b(),
    "offline-8b-peer": offline_8b_peer(),
    "nano-vllm": peer.part(PHASE, "1b"),
    "nano-vllm-8b": peer.part(PHASE, "8b"),
    "speculation": speculation,
    "serving": serving("llama-1b", "1,8,64"),
    "serving-8b": serving("llama-8b", "1,64"),
    "profile-pair": profile_part(PHASE, [(ENGINE, {"attention_backend": "triton", "cuda_graph": False}),
                                         (ENGINE, {"attention_backend": "triton", "cuda_graph": True})]),
    "fusion": standard("latency", "llama-1b", "--file", "fusion", engines=FUSION),
    "fusion-8b": standard("latency", "llama-8b", "--file", "fusion", engines=FUSION),
    "parity": greedy_parity.part(PHASE),
    "self-draft": self_draft,
}
SMALL = ("--scale", "small")
CPU_PARTS = {
    "latency": standard("latency", "tiny-llama", *SMALL, engines=(ENGINE,)),
    "concurrency": standard("concurrency", "tiny-llama", "--concurrency", "8,32", *SMALL, engines=(ENGINE,)),
    "serving": serving("tiny-llama", "1,8", *SMALL),
    "profile-pair": profile_part(PHASE, [(ENGINE, {"attention_backend": "torch", "cuda_graph": False}),
                                         (ENGINE, {"attention_backend": "torch", "cuda_graph": True})]),
    "parity": greedy_parity.part(PHASE, small=True),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
