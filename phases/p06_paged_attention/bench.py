"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison run by common.bench: the engines are measured in one process,
interleaved and repeated. On a GPU each part fits one 10-minute call; on a CPU the same
comparisons run at --scale small on tiny-llama, where only the torch backend exists.

The previous engine (attention over K/V gathered into a padded batch) against this one with
each attention backend: flash-attn reads K/V in place through the block tables, torch is the
exact reference that still gathers. At batch 1 and with 64 requests in flight (standard 512-token
prompts, and in "concurrency-long" and "-8k" prompts that take the context to 4k and 8k, where the
gathering backend is the baseline: reading in place against gathering, on the same step); on a GPU the
"syncs" part counts a decode step's host-device synchronizations (CUDA's own sync debug mode),
and "profile-pair" profiles p05's decode step and p06's in one process.
"""
from __future__ import annotations

import sys

import torch

from common.bench_set import aa, run_parts
from common.device import device_name
from common.engines import make_engine
from common.profile_pair import profile_part
from common.results import RESULTS, device_tag, provenance, write_records
from common.sampling import SamplingParams
from common.sync_count import syncs_per_step

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p06"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p05"
FLASH, TORCH = f"{ENGINE} attention_backend=flash-attn", f"{ENGINE} attention_backend=torch"
ENGINES = aa(f"{PREVIOUS},{FLASH},{TORCH}")                 # the previous engine twice: the A/A control
# What reading K/V in place buys, alone: both backends run p06's step (one input upload, no host
# syncs), torch gathers K/V into a padded batch, flash-attn reads the pool through the block
# tables. The gathering backend is the baseline here, built twice.
IN_PLACE = aa(f"{TORCH},{FLASH},{PREVIOUS}")


def compare(*run: str, engines: str = ENGINES) -> list[list[str]]:
    return [[*run, "--engines", engines]]


GPU_PARTS = {
    "latency": compare("--workload", "latency", "--presets", "llama-1b", engines=f"{ENGINES},hf-static"),
    "latency-8b": compare("--workload", "latency", "--presets", "llama-8b", engines=f"{ENGINES},hf-static"),
    "concurrency": compare("--workload", "concurrency", "--concurrency", "1,64", "--presets", "llama-1b"),
    "concurrency-8b": compare("--workload", "concurrency", "--concurrency", "1,64", "--presets", "llama-8b"),
}
# Long contexts, 64 in flight, decoding to 4k and 8k tokens (llama-1b's 8192 positions): the gather's
# passes over K/V grow with the context, so these parts measure reading in place against gathering
# (IN_PLACE; "concurrency-long" holds the phase's headline). One part each: at 8k a round of p05
# and p06 torch takes about two minutes, so there the twin is flash-attn's (a round of seconds): a
# twin of a gathering engine would not fit one 10-minute call.
LONG_PROMPTS = {"concurrency-long": (3840, IN_PLACE),
                "concurrency-long-8k": (7936, aa(f"{TORCH},{FLASH},{PREVIOUS}", base=FLASH))}
for name, (n, engines) in LONG_PROMPTS.items():
    GPU_PARTS[name] = compare("--workload", "concurrency", "--concurrency", "64", "--prompt-len", str(n),
                              "--presets", "llama-1b", engines=engines)
SMALL = ("--scale", "small", "--presets", "tiny-llama")
CPU_ENGINES = aa(f"{PREVIOUS},{TORCH}")
CPU_PARTS = {
    "latency": compare("--workload", "latency", *SMALL, engines=CPU_ENGINES),
    "concurrency": compare("--workload", "concurrency", "--concurrency", "1,8", *SMALL, engines=CPU_ENGINES),
    "concurrency-long": compare("--workload", "concurrency", "--concurrency", "8", "--prompt-len", "960", *SMALL,
                                engines=CPU_ENGINES),
}


# --- the syncs part: host-device synchronizations per decode step, counted by CUDA itself -------
SYNC_BATCHES = (8, 64)


def sync_count(argv: list[str], make_command: str) -> None:
    """Per backend and batch: syncs per decode step, where they happen and who asks (common.sync_count)."""
    name = device_name("cuda")
    for backend in ("flash-attn", "torch"):
        llm = make_engine(ENGINE, "llama-1b", "cuda", "bfloat16", attention_backend=backend, kv_cache_bytes=1 << 30)
        for batch in SYNC_BATCHES:
            write_records(RESULTS / PHASE / f"syncs-{device_tag(name)}.json",
                          [sync_record(name, backend, batch, syncs_per_step(llm, batch), make_command)])
        del llm


def sync_record(name: str, backend: str, batch: int, metrics: dict, make_command: str) -> dict:
    print(f"[bench] {ENGINE} {backend}: {metrics['syncs_per_step']:g} host-device syncs per decode step "
          f"(batch {batch}), at {metrics['sync_sites']}, asked by {metrics['sync_callers']}", flush=True)
    return {"phase": PHASE, "engine": ENGINE, "workload": "syncs", "preset": "llama-1b", "dtype": "bfloat16",
            "scale": "full", "device": name, "part": "syncs", "setting": {"batch": batch, "attention_backend": backend},
            "metrics": metrics, "provenance": provenance(name) | {"make_command": make_command}}


GPU_PARTS["syncs"] = sync_count


# --- the profile-pair part: p05's decode step and p06's (each backend) profiled in one process --
GPU_PARTS["profile-pair"] = profile_part(PHASE, [(PREVIOUS, {}), *((ENGINE, {"attention_backend": backend})
                                                                    for backend in ("flash-attn", "torch"))])
CPU_PARTS["profile-pair"] = profile_part(PHASE, [(PREVIOUS, {}), (ENGINE, {"attention_backend": "torch"})])


AGREE_PROMPTS, AGREE_TOKENS = (7, 33, 200, 511, 1000, 64, 129, 300), 64


def recorded_logits(llm) -> list[tuple[int, int, torch.Tensor]]:
    """Wrap the engine's model runner: for every row of every step, (sequence id, index of the
    output token this row samples, fp32 logits on the host)."""
    rows, run = [], llm.runner.run

    def recording(seqs, is_prefill):
        logits = run(seqs, is_prefill)
        rows.extend((s.seq_id, len(s.output_ids), row) for s, row in zip(seqs, logits.float().cpu()))
        return logits
    llm.runner.run = recording
    return rows


def backends_agree(argv: list[str], make_command: str) -> None:
    """llama-1b random weights in bf16, 8 prompts of awkward lengths, 64 greedy tokens each, once
    per backend: how many leading tokens flash-attn shares with torch, and the largest logit
    difference over the rows whose inputs were still identical (the sequence's tokens so far agree).
    Random weights give near-flat logits, so bf16 rounding flips near-ties: greedy tokens then part."""
    name = device_name("cuda")
    params = SamplingParams(temperature=0, max_tokens=AGREE_TOKENS, ignore_eos=True)
    prompts = [[(7 * i + 13 * n) % 30000 + 100 for i in range(n)] for n in AGREE_PROMPTS]
    outs, rows = {}, {}
    for backend in ("torch", "flash-attn"):
        llm = make_engine(ENGINE, "llama-1b", "cuda", "bfloat16", attention_backend=backend,
                          kv_cache_bytes=1 << 30)
        rows[backend] = recorded_logits(llm)
        outs[backend] = [o.token_ids for o in llm.generate(prompts, params)]
        del llm
    prefix = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
              for x, y in zip(outs["torch"], outs["flash-attn"])]
    # Rows pair up in order (same scheduling while lengths are fixed); keep those with equal inputs.
    base = min(seq for seq, _, _ in rows["torch"])
    same = [(a, b) for (seq, t, a), (_, _, b) in zip(rows["torch"], rows["flash-attn"]) if t <= prefix[seq - base]]
    diffs = [(a - b).abs().max().item() for a, b in same]
    top1 = sum(a.argmax() == b.argmax() for a, b in same) / len(same)
    scale = torch.stack([a for a, _ in same]).std().item()
    rec = {"phase": PHASE, "engine": ENGINE, "workload": "agree", "preset": "llama-1b", "dtype": "bfloat16",
           "scale": "full", "device": name, "part": "agree",
           "setting": {"prompts": list(AGREE_PROMPTS), "max_tokens": AGREE_TOKENS, "backends": "flash-attn vs torch"},
           "metrics": {"agreeing_prefix": prefix, "tokens": len(AGREE_PROMPTS) * AGREE_TOKENS,
                       "identical_input_rows": len(same), "top1_agreement": float(top1),
                       "max_abs_logit_diff": max(diffs), "median_abs_logit_diff_max": float(torch.tensor(diffs).median()),
                       "logit_std": scale},
           "provenance": provenance(name) | {"make_command": make_command}}
    print(f"[bench] flash-attn vs torch: leading tokens equal {prefix} of {AGREE_TOKENS}; over {len(same)} rows with "
          f"identical inputs: top-1 agreement {top1:.1%}, max |logit diff| {max(diffs):.3g} (logit std {scale:.3g})", flush=True)
    write_records(RESULTS / PHASE / f"agree-{device_tag(name)}.json", [rec])


GPU_PARTS["agree"] = backends_agree


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
