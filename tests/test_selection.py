"""The lineage-aware selection of `make test` (tests/selection.py): declarations that name real
suites, tests and files, and the rule itself on a temporary copy of a phase pair, where changing a
declared file selects the whole suite for that phase."""
from __future__ import annotations

import importlib
import inspect
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import selection
from tests.selection import ROOT, SUITES


def clear_caches():
    for f in (selection.phases, selection.phases_running, selection.runs_in_full, selection.marked_files_changed):
        f.cache_clear()


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_a_declaration_names_a_suite_its_tests_and_its_files(suite):
    module = importlib.import_module(f"tests.suites.{suite}")
    for name in SUITES[suite].smoke:
        assert callable(getattr(module, name, None)) and name.startswith("test_"), \
            f"tests/selection.py: {suite} has no test {name} for its smoke subset"
    running = selection.phases_running(suite)
    assert running, f"tests/selection.py declares {suite}, but no phase's tests import it"
    if SUITES[suite].files != selection.ALL:
        for f in SUITES[suite].files:     # a typo would make a file that never changes
            assert any((ROOT / "phases" / phase / f).is_file() for phase in running), \
                f"tests/selection.py: {suite} names {f}, which no phase that runs it has"


def test_every_phase_keeps_its_greedy_match_against_hf():
    """Every phase runs the correctness suite, in full where the files that compute its tokens
    changed, and elsewhere a smoke that compares the real model's greedy ids with HF's."""
    from tests.suites import correctness
    running = selection.phases_running("correctness")
    assert running == selection.phases()
    assert selection.runs_in_full("correctness", running[0])
    smoke = SUITES["correctness"].smoke
    assert "test_real_model_matches_hf_prefix" in smoke
    source = inspect.getsource(correctness.test_real_model_matches_hf_prefix)
    assert 'hf_reference("smollm2-135m")' in source and 'engines("smollm2-135m")' in source


def fake_item(phase: str, suite: str | None, name: str, markers=()):
    """What selection.selected reads from a collected pytest item."""
    return SimpleNamespace(module=SimpleNamespace(PHASE=phase), originalname=name,
                           function=SimpleNamespace(__module__=f"tests.suites.{suite}" if suite else f"tests.{phase}.x"),
                           get_closest_marker=lambda m: m if m in markers else None)


@pytest.fixture
def pair(tmp_path):
    """A temporary root holding two adjacent phases (p08 -> p09), each with a test file that runs
    the cli suite; the second's __main__.py and worker files are the first's, byte for byte."""
    clear_caches()
    names = ("p08_preemption", "p09_http_serving")
    for name in names:
        shutil.copytree(ROOT / "phases" / name, tmp_path / "phases" / name, ignore=shutil.ignore_patterns("__pycache__"))
        (tmp_path / "tests" / name).mkdir(parents=True)
        (tmp_path / "tests" / name / "test_cli.py").write_text(
            f'from tests.suites.cli import *  # noqa\n\nPHASE = "{name}"\n')
    for f in ("__main__.py", *selection.MARKED["worker_code"]):
        shutil.copy(tmp_path / "phases" / names[0] / f, tmp_path / "phases" / names[1] / f)
    yield tmp_path, names
    clear_caches()


def selected_names(root: Path, phase: str, suite: str) -> set[str]:
    module = importlib.import_module(f"tests.suites.{suite}")
    tests = [name for name in dir(module) if name.startswith("test_")]
    return {name for name in tests if selection.selected(fake_item(phase, suite, name), root)}


def test_changing_a_declared_file_selects_the_whole_suite(pair):
    root, (first, second) = pair
    whole = selected_names(root, first, "cli")
    assert len(whole) > len(SUITES["cli"].smoke)                       # the suite's first phase: in full
    assert selected_names(root, second, "cli") == set(SUITES["cli"].smoke)    # unchanged: smoke only
    with open(root / "phases" / second / "__main__.py", "a") as f:
        f.write("# changed\n")
    clear_caches()
    assert selected_names(root, second, "cli") == whole
    assert selected_names(root, first, "cli") == whole


def test_an_undeclared_suite_and_a_phases_own_tests_run_in_full(pair):
    root, (first, second) = pair
    assert selection.selected(fake_item(second, "no_such_suite_yet", "test_anything"), root)
    assert selection.selected(fake_item(second, None, "test_phase_specific"), root)


def test_a_file_marker_follows_its_files(pair):
    root, (first, second) = pair
    item = fake_item(second, None, "test_spawns_workers", markers=("worker_code",))
    assert not selection.selected(item, root)
    with open(root / "phases" / second / "worker_pool.py", "a") as f:
        f.write("# changed\n")
    clear_caches()
    assert selection.selected(item, root)


def test_a_slow_test_is_left_to_test_all(pair):
    root, (first, second) = pair
    assert selection.selected(fake_item(first, None, "test_fast"), root)
    assert not selection.selected(fake_item(first, None, "test_slow_variant", markers=("slow",)), root)
    assert not selection.selected(SimpleNamespace(get_closest_marker=lambda m: m if m == "slow" else None), root)


def test_the_fuzz_soak_runs_only_when_its_marker_is_named():
    """make fuzz (pytest -m fuzz_soak) asks for the soak; make test and make test-all do not."""
    def config(markexpr):
        return SimpleNamespace(getoption=lambda name, default=None: markexpr if name == "markexpr" else default)
    assert selection.soak_requested(config("fuzz_soak"))
    assert not selection.soak_requested(config(""))
    assert not selection.soak_requested(config("not slow"))


def test_all_phases_runs_everything(monkeypatch):
    monkeypatch.delenv(selection.ENV, raising=False)
    assert not selection.run_all()
    monkeypatch.setenv(selection.ENV, "1")
    assert selection.run_all()
    monkeypatch.setenv(selection.ENV, "0")
    assert not selection.run_all(SimpleNamespace(getoption=lambda name, default=None: False))
    assert selection.run_all(SimpleNamespace(getoption=lambda name, default=None: name == selection.OPTION))


def test_a_smoke_only_test_runs_where_its_suite_does_not_run_in_full():
    """The correctness smoke (16 greedy ids on the real model) is a subset of the full suite's 32:
    it runs where the suite's files are the previous phase's, never beside the full suite."""
    assert SUITES["correctness"].smoke_only
    full = selection.phases_running("correctness")[0]
    smoke = next(p for p in selection.phases_running("correctness") if not selection.runs_in_full("correctness", p))
    assert selection.runs_in_full("correctness", full)
    for phase, expected in ((full, False), (smoke, True)):
        item = fake_item(phase, "correctness", "test_real_model_matches_hf_prefix")
        assert selection.selected(item) is expected, phase
    assert selection.selected(fake_item(full, "correctness", "test_greedy_matches_hf"))
    assert not selection.selected(fake_item(smoke, "correctness", "test_greedy_matches_hf"))


def test_the_fuzzers_caught_seeds_follow_their_bugs_files():
    """make test runs a caught fuzzer seed in its bug's phase and where the bug's files change
    after it, CHANGED_CASES and CHANGED_INTERRUPTS first seeds where the fuzzed bookkeeping changed
    and one of each kind where it is the phase before's; make test-all runs every caught seed from
    its phase on, and FIRST_CASES and FIRST_INTERRUPTS everywhere."""
    from tests.suites import config_fuzz as fuzz
    for name in selection.phases():
        phase = fuzz.load_phase(name) if (ROOT / "phases" / name / "config.py").is_file() else None
        if phase is None or not (ROOT / "tests" / name / "test_config_fuzz.py").is_file():
            continue
        for seeds in (fuzz.CAUGHT_CASES, fuzz.CAUGHT_INTERRUPTS):
            everywhere = fuzz.caught(seeds, phase)
            assert everywhere == [s for s, first in seeds.items() if name[:3] >= first]
            for seed in everywhere:
                first = seeds[seed] == name[:3]
                expected = first or fuzz.changed(fuzz.CAUGHT_FILES[seed], phase)
                assert (seed in fuzz.caught(seeds, phase, everywhere=False)) == expected, (name, seed)
        unchanged = not fuzz.changed(fuzz.FUZZED_FILES, phase)
        for every, where_changed in ((fuzz.FIRST_CASES, fuzz.CHANGED_CASES),
                                     (fuzz.FIRST_INTERRUPTS, fuzz.CHANGED_INTERRUPTS)):
            assert len(fuzz.first_seeds(phase, True, every, where_changed)) == every
            assert len(fuzz.first_seeds(phase, False, every, where_changed)) == \
                (fuzz.FIRST_UNCHANGED if unchanged else where_changed), name
    for files in fuzz.CAUGHT_FILES.values():         # a typo would name a file that never changes
        assert all(any((ROOT / "phases" / p / f).is_file() for p in selection.phases()) for f in files), files
    p15 = fuzz.load_phase("p15_flash_decoding")       # its changes are the forward's arithmetic alone
    assert list(fuzz.first_seeds(p15, False, fuzz.FIRST_CASES, fuzz.CHANGED_CASES)) == [0]
    assert fuzz.caught(fuzz.CAUGHT_CASES, p15, everywhere=False) == []
    assert fuzz.caught(fuzz.CAUGHT_INTERRUPTS, p15, everywhere=False) == []


def test_every_file_marker_is_registered_and_names_real_files():
    """A MARKED marker is declared in pytest.ini (a typo in a test's marker would select nothing),
    and its files exist in some phase (a typo in a file name would never change)."""
    registered = (ROOT / "pytest.ini").read_text()
    for marker, files in selection.MARKED.items():
        assert f"\n    {marker}:" in registered, f"pytest.ini does not register the marker {marker}"
        for f in files:
            file, _, part = f.partition("::")
            assert not part or part in selection.PARTS, (marker, f)
            assert any((ROOT / "phases" / p / file).is_file() for p in selection.phases()), (marker, f)


def test_prompt_lookups_real_model_check_follows_the_speculator():
    """Speculative decoding's HF check on the real model (n-gram drafts kept, which tiny-llama's
    random text never gives) runs in make test where the speculator is born and where its files
    change; its tiny-llama twin runs wherever the suite runs in full; make test-all runs both."""
    from tests.suites import speculative_decoding as spec
    running = selection.phases_running("speculative_decoding")
    marked = [p for p in running if selection.marked_files_changed("speculator_code", p)]
    assert marked[0] == running[0] and set(marked) < set(running)      # born there; unchanged somewhere after
    source = inspect.getsource(spec.test_real_model_tokens_are_hfs)
    assert '"smollm2-135m"' in source and "spec_decode_num_accepted_tokens\"] > 0" in source
    for phase in running:
        real = fake_item(phase, "speculative_decoding", "test_real_model_tokens_are_hfs", markers=("speculator_code",))
        tiny = fake_item(phase, "speculative_decoding", "test_tiny_model_tokens_are_hfs")
        full = selection.runs_in_full("speculative_decoding", phase)
        assert selection.selected(real) == (full and phase in marked), phase
        assert selection.selected(tiny) == full, phase


def test_the_clis_own_tests_follow_its_code_paths(pair):
    """The CLI's own tests (a real process, --chat --prompt on the real model) follow __main__.py's
    imports, main() and __main__ block: not a flag's help text, a forwarded option or another
    function, but an import or a new statement in main() selects them."""
    root, (first, second) = pair
    item = fake_item(second, "cli", "test_cli_error_in_a_real_process_is_one_line_and_status_1",
                     markers=("cli_paths",))
    assert selection.selected(fake_item(first, "cli", item.originalname, markers=("cli_paths",)), root)
    assert not selection.selected(item, root)
    main = root / "phases" / second / "__main__.py"
    source = main.read_text()
    call, parse = "options = dict(device=args.device,", "def parse_args(argv=None):"
    assert call in source and parse in source
    for unchanged in (source.replace(call, call + " x=1,"), source.replace(parse, parse + "\n    x = 1"),
                      source + "\n\ndef helper():\n    pass\n"):
        main.write_text(unchanged)
        clear_caches()
        assert not selection.selected(item, root)
    for changed in ("import json\n" + source, source.replace(call, "print()\n        " + call)):
        main.write_text(changed)
        clear_caches()
        assert selection.selected(item, root)
    from tests.suites import cli
    for test in (cli.test_cli_error_in_a_real_process_is_one_line_and_status_1,
                 cli.test_cli_chat_answers_on_the_real_model):
        assert [m.name for m in test.pytestmark] == ["cli_paths"], test.__name__
