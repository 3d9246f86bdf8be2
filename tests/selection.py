"""Which tests `make test` runs: each shared suite in full only where its code changed.

A suite in tests/suites/ is written once and imported by tests/pNN_topic/test_*.py in many phases,
and most of those phases carry the suite's code byte for byte from the phase before
(tests/test_lineage.py proves which files are identical). Running every test again there checks
the same code again. So each suite declares here, in one place, the phase files whose code its
tests check (paths relative to the phase folder; ALL means every file of the phase), and a smoke
subset that still drives the phase's own engine end to end:

- full: in the first phase that runs the suite, and in every phase where one of its files differs
  from (or is missing in) the nearest earlier phase that runs the suite;
- smoke: everywhere else, only the tests named in `smoke` (test function names; all their
  parametrizations run). A suite whose smoke checks a subset of what its full tests check says
  `smoke_only=True`: where it runs in full, its smoke does not run beside it.

A suite not declared here runs in full in every phase (so a new suite is safe until declared), and
so does every test that a phase's own file defines (only functions defined in tests/suites/ are
selected). A marker can name files too (MARKED): a test carrying it runs only in phases whose copy
of those files differs from the previous phase's, whatever suite it belongs to; "file::part" names
a part of a file (PARTS: "__main__.py::paths", the CLI's code paths without the flags it forwards).

A test marked @pytest.mark.slow (a variant of a check that a faster test of the same function
already makes in `make test`) runs only in `make test-all`. A test marked @pytest.mark.fuzz_soak
(the config and interrupt fuzzers' long run) runs only when the marker expression names it
(`make fuzz`, pytest -m fuzz_soak): neither make test nor make test-all.

`make test-all` (pytest --all-phases, or MINI_INFER_TEST_ALL=1) runs every test in every phase.
Declaring a new suite is one line in SUITES, e.g.

    "chunked_prefill": Suite(("scheduler.py", "model_runner.py"), smoke=("test_long_prompt_matches_reference",)),
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALL = ("*",)                                    # every file of the phase folder
ENV = "MINI_INFER_TEST_ALL"                     # set (not "" or "0"): every test in every phase
OPTION = "--all-phases"
NOT_CODE = {"README.md", "CHANGES"}             # what ALL leaves out (tests/test_lineage.py's NOT_ENGINE)


@dataclass(frozen=True)
class Suite:
    files: tuple[str, ...]      # the phase files whose code the suite's tests check
    smoke: tuple[str, ...]      # the tests that run where those files are unchanged
    smoke_only: bool = False    # the smoke checks a subset of what the full suite checks: not run beside it


# The files a suite's tests check, not every file its engine passes through: the smoke subsets
# drive the whole engine anyway, and the correctness suite holds every phase to HF's greedy
# tokens on the real model (its smoke too). Names in `smoke` are checked by tests/test_selection.py.
SUITES: dict[str, Suite] = {
    # greedy exact match against HF, in full where the files that compute the tokens changed; the
    # smoke holds every other phase to HF's greedy ids on the real model (the whole prompt set in
    # one batch, a shorter run), so the rest of the engine is driven too
    "correctness": Suite(("model.py", "layers.py", "attention.py", "attention_backends.py", "triton_decode.py",
                          "kv_cache.py", "model_runner.py", "sampler.py"),
                         smoke=("test_real_model_matches_hf_prefix",), smoke_only=True),   # full: 32 ids, not 16
    # the checks are common/requests.py's and config.py's; the engine's part, calling them before
    # any work, is what the smoke's test_bad_request_in_batch_does_no_work checks in every phase
    "bad_input": Suite(("config.py",),
                       smoke=("test_prompt_plus_max_tokens_over_context", "test_bad_request_in_batch_does_no_work")),
    # top-k/top-p/seeds are sampler.py's, stop strings, max_tokens and EOS sequence.py's; the smoke
    # keeps the engine's part (a generator per seeded request) in every phase, and correctness
    # covers EOS on the real model there (test_ignore_eos makes a tiny-llama token the EOS)
    "sampling": Suite(("sampler.py", "sequence.py"),
                      smoke=("test_seeded_request_ignores_batch_neighbours", "test_stop_string")),
    "recovery": Suite(("engine.py", "scheduler.py", "block_manager.py", "sequence.py"),
                      smoke=("test_after_failure_matches_fresh_engine",)),
    "continuous_batching": Suite(("engine.py", "scheduler.py", "block_manager.py", "sequence.py", "kv_cache.py",
                                  "model_runner.py", "config.py"),
                                 smoke=("test_staggered_arrivals_match_reference",)),
    "cli": Suite(("__main__.py",), smoke=("test_cli_generates_and_reports",)),
    "broken_checkpoint": Suite(("__main__.py", "engine.py", "model.py", "config.py"),
                               smoke=("test_good_directory_matches_preset", "test_truncated_safetensors")),
    "profile": Suite(("profiler.py", "__main__.py"), smoke=("test_summary_has_every_stage_and_sane_numbers",)),
    "vectorized_gather": Suite(("kv_cache.py", "model_runner.py", "attention.py"),
                               smoke=("test_gather_equals_a_per_sequence_reference",)),
    # the smoke: every phase from p05 on runs its own pipeline once (a pipeline's steps follow the
    # phase's scheduler, whatever files it changes); a replica is the phase's whole in-process
    # engine behind the same worker code, so replicas run where that code changed
    "replicas": Suite(("router.py", "worker.py", "worker_pool.py", "pipeline.py"),
                      smoke=("test_pipeline_gives_the_in_process_tokens",)),
    # faults are the pool's and the router's (call ids, aborts, dead workers); pipeline.py describes
    # steps, which the replicas suite's pipeline test above checks in every phase. The smoke starts
    # no process: the replicas suite drives the phase's workers end to end
    "parallel_faults": Suite(("router.py", "worker.py", "worker_pool.py"),
                             smoke=("test_LLM_points_at_ParallelLLM_and_starts_no_process",
                                    "test_the_bench_builds_ParallelLLM_for_a_parallel_mode",
                                    "test_a_request_that_can_never_fit_is_named_by_its_index")),
    # the smoke serves the phase's engine through the HTTP app and engine loop of the last full phase
    # (byte for byte): a reply equals the offline engine's. Streaming and aborted streams are that
    # server code's, run in full there; each engine's own aborts are the config fuzzer's (p09 on)
    "server": Suite(("server.py", "async_engine.py", "engine_loop.py", "openai_protocol.py", "metrics.py", "serve.py",
                     "worker.py"),
                    smoke=("test_completion_equals_offline_engine", "test_serve_refuses_bad_options_with_a_message")),
    # processes: who starts, watches and ends the server and its engine (what the server answers is
    # the server suite's, whose smoke serves every phase's engine through the same HTTP app and
    # engine process); no smoke: where these files are unchanged, only the phase's engine differs
    "served": Suite(("served.py", "serve.py", "async_engine.py", "worker.py", "worker_pool.py"), smoke=()),
    # the plan (chunks, budget, partial prefills, preemption mid-prompt) is the scheduler's, what a
    # chunk reads is the runner's and the backends'; the smoke chunks a long prompt beside a decode
    "chunked_prefill": Suite(("scheduler.py", "model_runner.py", "attention_backends.py", "block_manager.py"),
                             smoke=("test_a_prompt_longer_than_the_budget_is_accepted",
                                    "test_decodes_first_then_chunks_in_one_step")),
    # the verify, rollback and proposers; the smoke drafts through the engine and the prefix cache
    "speculative_decoding": Suite(("speculator.py", "proposers.py", "draft_proposer.py", "sampler.py", "engine.py",
                                   "block_manager.py", "sequence.py", "model_runner.py"),
                                  smoke=("test_refused_draft_at_each_position", "test_drafts_never_enter_the_prefix_cache")),
}

# A test with one of these markers runs only where these files changed from the previous phase
# ("file::part": only where that part of the file changed, PARTS below).
MARKED: dict[str, tuple[str, ...]] = {
    "worker_code": ("worker.py", "worker_pool.py"),    # processes spawned, killed, left to die
    "server_process": ("serve.py", "served.py"),      # the server process started, interrupted, orphaned
    "sampler_code": ("sampler.py",),                  # rejection sampling's statistics: sampler.verify alone
    # prompt lookup's drafts kept on the real model (tiny-llama's random text gives none to keep)
    "speculator_code": ("speculator.py", "proposers.py", "sampler.py"),
    # the CLI's own paths (a real `python -m phases.<phase>` ending in an error, --chat --prompt on
    # the real model): how a run starts, branches and exits, not the flags it hands to the engine
    "cli_paths": ("__main__.py::paths",),
}


class _Unforwarded(ast.NodeTransformer):
    """Drops what a call or a dict forwards (keyword arguments, entries), keeping what runs."""

    def visit_Call(self, node):
        self.generic_visit(node)
        node.keywords = []
        return node

    def visit_Dict(self, node):
        return ast.Dict(keys=[], values=[])


def code_paths(source: str) -> str:
    """A CLI module's imports, its `if __name__ == "__main__":` block and main(), without the options
    main() forwards (keyword arguments, dict entries) and without parse_args(): what changes where
    a phase changes how a run starts, branches, fails or exits, not where it adds a flag and hands
    it to the engine."""
    kept = [node for node in ast.parse(source).body if isinstance(node, (ast.Import, ast.ImportFrom, ast.If))
            or isinstance(node, ast.FunctionDef) and node.name == "main"]
    return "\n".join(ast.dump(_Unforwarded().visit(node)) for node in kept)


PARTS = {"paths": code_paths}                   # "file::part" in MARKED: PARTS[part](the file's text)

SLOW = "slow"                                   # a marker: only in make test-all
SOAK = "fuzz_soak"                              # a marker: only when -m names it (make fuzz)

SUITE_IMPORT = re.compile(r"^from tests\.suites\.(\w+) import", re.M)


def soak_requested(config) -> bool:
    """Whether this run asked for the fuzz soak by name (pytest -m fuzz_soak, as make fuzz does)."""
    return SOAK in (config.getoption("markexpr", default="") or "")


def run_all(config=None) -> bool:
    """Whether every test runs in every phase: --all-phases, or MINI_INFER_TEST_ALL set."""
    if config is not None and config.getoption(OPTION, default=False):
        return True
    return os.environ.get(ENV, "") not in ("", "0")


@cache
def phases(root: Path = ROOT) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in (root / "phases").iterdir() if p.is_dir() and re.fullmatch(r"p\d\d_\w+", p.name)))


@cache
def phases_running(suite: str, root: Path = ROOT) -> tuple[str, ...]:
    """The phases whose test folder imports tests/suites/<suite>.py."""
    return tuple(phase for phase in phases(root) if (root / "tests" / phase).is_dir() and any(
        suite in SUITE_IMPORT.findall(f.read_text()) for f in sorted((root / "tests" / phase).glob("test_*.py"))))


def _files(phase_dir: Path, files: tuple[str, ...]) -> dict[str, bytes | str | None]:
    if files == ALL:
        found = [f for f in sorted(phase_dir.rglob("*")) if f.is_file() and "__pycache__" not in f.parts
                 and f.name not in NOT_CODE]
        return {str(f.relative_to(phase_dir)): f.read_bytes() for f in found}
    return {name: _read(phase_dir, name) for name in files}


def _read(phase_dir: Path, name: str) -> bytes | str | None:
    """A file's bytes, or for "file::part" PARTS[part] of its text; None where it is missing."""
    file, _, part = name.partition("::")
    if not (phase_dir / file).is_file():
        return None
    return PARTS[part]((phase_dir / file).read_text()) if part else (phase_dir / file).read_bytes()


def differ(files: tuple[str, ...], phase: str, before: str | None, root: Path = ROOT) -> bool:
    """Whether any of `files` differs between two phase folders (None: there is no phase before)."""
    if before is None:
        return True
    return _files(root / "phases" / phase, files) != _files(root / "phases" / before, files)


@cache
def runs_in_full(suite: str, phase: str, root: Path = ROOT) -> bool:
    """True where the suite runs in full: undeclared suites, the suite's first phase, and phases
    whose copy of a declared file differs from the nearest earlier phase that runs the suite."""
    if suite not in SUITES:
        return True
    running = phases_running(suite, root)
    earlier = [p for p in running if p < phase]
    return differ(SUITES[suite].files, phase, earlier[-1] if earlier else None, root)


@cache
def marked_files_changed(marker: str, phase: str, root: Path = ROOT) -> bool:
    """Whether a phase's copy of the files MARKED[marker] names differs from the previous phase's."""
    names = phases(root)
    if phase not in names:
        return True
    index = names.index(phase)
    return differ(MARKED[marker], phase, names[index - 1] if index else None, root)


def suite_of(item) -> str | None:
    """The shared suite a collected test comes from (tests/suites/<name>.py), or None."""
    module = getattr(getattr(item, "function", None), "__module__", "") or ""
    return module.rsplit(".", 1)[1] if module.startswith("tests.suites.") else None


def selected(item, root: Path = ROOT) -> bool:
    """Whether `make test` runs this collected test (see the module docstring)."""
    if item.get_closest_marker(SLOW) is not None:
        return False
    phase = getattr(getattr(item, "module", None), "PHASE", None)
    if phase is None:
        return True
    for marker in MARKED:
        if item.get_closest_marker(marker) is not None and not marked_files_changed(marker, phase, root):
            return False
    suite = suite_of(item)
    if suite is None or suite not in SUITES:
        return True
    smoke = item.originalname in SUITES[suite].smoke
    if runs_in_full(suite, phase, root):
        return not (smoke and SUITES[suite].smoke_only)
    return smoke
