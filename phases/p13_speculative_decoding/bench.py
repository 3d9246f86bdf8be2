"""`make phase-NN bench [PART=name]`: this phase's standard benchmark set, in named parts.

Each part is one comparison, the engines measured in one process, interleaved and repeated, the
previous phase built twice ("p12", "p12#2": the run's A/A control). On a GPU each part fits one
10-minute call; on a CPU the same comparison runs at small scale on tiny-llama.

acceptance (common/spec_decode.py, CPU): the real SmolLM2, greedy, on prompts whose answer copies
from the prompt and on open-ended ones: how often prompt lookup's drafts are accepted, tokens per
target step, per-request TPOT (acceptance-draft: the same for the self-draft). On a GPU in bf16
with p13 itself (speculation off) beside p12 twice: the real proposers' gain on the real model.
speed-1, speed-4, speed-16, speed-64: llama-8b at that batch, a scripted proposer that replays the
target's own greedy continuation with each token kept at a set rate (0.3 to 0.95), k = 2, 4, 8;
speed-64 also with the switch moved past 64 (speculating there), which the default switch avoids.
"""
from __future__ import annotations

import sys

from common import spec_decode
from common.bench_set import run_parts

PHASE = __package__.split(".")[-1]
ENGINE = PHASE[:3]                                          # "p13"
PREVIOUS = f"p{int(ENGINE[1:]) - 1:02d}"                    # "p12"
AA = [PREVIOUS, PREVIOUS + "#2"]
NGRAM = [f"{ENGINE} speculative=ngram num_speculative_tokens={k}" for k in (4, 8)]
SCRIPTED = f"{ENGINE} speculative=ngram"                    # its proposer replaced by the scripted one


def spec(name: str, measure: str, preset: str, engines: list[str], *extra: str):
    """A part that runs common.spec_decode (its own runner, not common.bench's workloads)."""
    def part(rest: list[str], command: str) -> None:
        spec_decode.main([measure, "--phase", PHASE, "--presets", preset, "--engines", ",".join(engines), *extra,
                          *rest], part=name, make_command=command)
    part.preset, part.engines, part.extra = preset, engines, extra                   # for tests
    return part


def speed(batch: int, *extra: str):
    return spec(f"speed-{batch}", "speed", "llama-8b", AA + [SCRIPTED], "--batches", str(batch), *extra)


GPU_PARTS = {
    # the real proposers on the real model, bf16: speculation against this engine without it (p13)
    "acceptance": spec("acceptance", "acceptance", "smollm2-135m", AA + [ENGINE] + NGRAM),
    "acceptance-draft": spec("acceptance-draft", "acceptance", "smollm2-135m",
                             AA + [ENGINE, f"{ENGINE} speculative=draft num_speculative_tokens=2"],
                             "--file", "acceptance-draft"),
    "speed-1": speed(1),
    "speed-4": speed(4),
    "speed-16": speed(16),
    "speed-64": speed(64, "--acceptances", "0.8,0.95", "--ks", "2,4", "--switch", "default,64"),
}
CPU_PARTS = {
    # acceptance is the same on any machine and in every repeat: one repeat of 64 new tokens keeps the
    # part short on a shared 2-core machine (its speed columns are then one pair, no range)
    "acceptance": spec("acceptance", "acceptance", "smollm2-135m", AA + NGRAM, "--scale", "small", "--repeats", "1"),
    "acceptance-draft": spec("acceptance-draft", "acceptance", "smollm2-135m",
                             AA + [f"{ENGINE} speculative=draft num_speculative_tokens=2"], "--scale", "small",
                             "--repeats", "1",
                             "--file", "acceptance-draft"),
    "speed": spec("speed", "speed", "tiny-llama", AA + [SCRIPTED], "--batches", "1,16", "--acceptances", "0.6,0.95",
                  "--ks", "2,4", "--scale", "small", "--repeats", "2"),
}


def main(argv: list[str]) -> None:
    run_parts(PHASE, GPU_PARTS, CPU_PARTS, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
