"""Every phase README is a page a learner finishes, and opens with its idea, its headline result and
the command that reproduces it.

On the README's first screen (before its first `## ` section and before any table, a line starting
with "|"; at most FIRST_SCREEN lines): a line starting with `**Idea:**`, the generated
`<!-- results:headline -->` marker, a line starting with `**A/A:**` (the headline's A/A range, or
that it awaits one), a line starting with `**Reproduce:**` whose `make phase-NN bench PART=<part>`
names this phase and a part of its bench.py (GPU_PARTS for a headline measured on a GPU, CPU_PARTS
for one measured on a CPU), and a link to the phase's notebook. The whole README stays under
MAX_LINES lines. The top README's "Reading the numbers" stays under READING_LINES lines, and its
opening counts the phases its course map links.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from common import report

ROOT = Path(__file__).resolve().parent.parent
PHASES = sorted(p.name for p in (ROOT / "phases").glob("p[0-9][0-9]_*") if p.is_dir())
REPRODUCE = re.compile(r"make phase-(\d\d) bench PART=([\w-]+)")
MAX_LINES = 150          # a phase README is under this many lines
FIRST_SCREEN = 45        # the opening (idea, headline, A/A, reproduce, notebook) fits one screen
READING_LINES = 20       # the top README's "Reading the numbers" is under this many lines


def readme(phase: str) -> list[str]:
    return (ROOT / "phases" / phase / "README.md").read_text().splitlines()


def first_screen(phase: str) -> list[str]:
    """The README's lines before its first `## ` section or table line, whichever comes first."""
    lines = readme(phase)
    end = next((i for i, line in enumerate(lines) if line.startswith(("|", "## "))), len(lines))
    return lines[:end]


def test_every_phase_has_a_readme():
    assert PHASES, "no phase folders found"
    for phase in PHASES:
        assert (ROOT / "phases" / phase / "README.md").is_file(), phase


@pytest.mark.parametrize("phase", PHASES)
def test_idea_line_comes_first(phase):
    ideas = [line for line in first_screen(phase) if line.startswith("**Idea:**")]
    assert ideas, f"{phase}/README.md: no `**Idea:**` line before the first table"
    assert len(ideas[0]) > len("**Idea:**") + 10, f"{phase}/README.md: the Idea line is empty"


@pytest.mark.parametrize("phase", PHASES)
def test_headline_marker_before_any_table(phase):
    text = "\n".join(first_screen(phase))
    m = re.search(r"<!-- results:headline -->(.*?)<!-- /results:headline -->", text, re.S)
    assert m, f"{phase}/README.md: no closed headline marker before the first table"
    body = m.group(1).strip()
    assert body, f"{phase}/README.md: the headline marker is empty; run `python -m common.report`"
    assert "No headline defined" not in body, f"{phase}: add it to common/report.py HEADLINES"
    assert phase in report.HEADLINES, f"{phase}: add it to common/report.py HEADLINES"


@pytest.mark.parametrize("phase", PHASES)
def test_headline_marker_is_generated(phase):
    """The marker's text is what common.report writes now, not a stale or hand-typed sentence."""
    text = (ROOT / "phases" / phase / "README.md").read_text()
    m = re.search(r"<!-- results:headline -->\n(.*?)\n<!-- /results:headline -->", text, re.S)
    assert m, f"{phase}/README.md: no headline marker"
    expected = f"{report.NOTE}\n{report.headline(report.load_records(ROOT), phase)}"
    assert m.group(1) == expected, f"{phase}/README.md: headline is stale; run `python -m common.report`"


@pytest.mark.parametrize("phase", PHASES)
def test_reproduce_line_names_a_part_of_this_phase(phase):
    lines = [line for line in first_screen(phase) if line.startswith("**Reproduce:**")]
    assert lines, f"{phase}/README.md: no `**Reproduce:**` line before the first table"
    m = REPRODUCE.search(lines[0])
    assert m, f"{phase}/README.md: the Reproduce line has no `make phase-NN bench PART=<part>`"
    assert m.group(1) == phase[1:3], f"{phase}/README.md: the Reproduce command names phase-{m.group(1)}"
    bench = importlib.import_module(f"phases.{phase}.bench")
    on_cpu = report.HEADLINES[phase][-1] == "cpu"
    parts = bench.CPU_PARTS if on_cpu else bench.GPU_PARTS
    assert m.group(2) in parts, (f"{phase}/README.md: PART={m.group(2)} is not in bench.py's "
                                 f"{'CPU' if on_cpu else 'GPU'}_PARTS ({', '.join(parts)})")


@pytest.mark.parametrize("phase", PHASES)
def test_readme_is_under_the_line_limit(phase):
    n = len(readme(phase))
    assert n < MAX_LINES, (f"{phase}/README.md has {n} lines (limit {MAX_LINES}): move run bookkeeping to "
                           f"results/{phase}/RUNS.md (python -m common.runs) and long ratio lists to the notebook")


@pytest.mark.parametrize("phase", PHASES)
def test_first_screen_fits_one_screen(phase):
    n = len(first_screen(phase))
    assert n <= FIRST_SCREEN, f"{phase}/README.md: the opening runs {n} lines before its first section"


@pytest.mark.parametrize("phase", PHASES)
def test_first_screen_states_the_a_a_status(phase):
    lines = [line for line in first_screen(phase) if line.startswith("**A/A:**")]
    assert lines, f"{phase}/README.md: no `**A/A:**` line (the headline's A/A range, or that it awaits one)"


@pytest.mark.parametrize("phase", PHASES)
def test_first_screen_links_the_notebook(phase):
    notebooks = sorted((ROOT / "notebooks").glob(f"{phase[:3]}_*.ipynb"))
    assert notebooks, f"no notebooks/{phase[:3]}_*.ipynb"
    link = f"../../notebooks/{notebooks[0].name}"
    assert any(link in line for line in first_screen(phase)), f"{phase}/README.md: no link to {link} on its first screen"


@pytest.mark.parametrize("phase", PHASES)
def test_no_reference_to_what_a_reader_does_not_have(phase):
    text = "\n".join(readme(phase))
    for phrase in ("the issue", "DESIGN.md", "DESIGN section"):
        assert phrase.lower() not in text.lower(), f"{phase}/README.md mentions {phrase!r}"


def test_code_and_notebooks_cite_no_design_document():
    """The design notes that planned this repository are not part of it: no docstring, comment or
    notebook sends a reader to them."""
    files = [*(ROOT / "phases").rglob("*.py"), *(ROOT / "common").rglob("*.py"), *(ROOT / "notebooks").glob("*.ipynb")]
    cited = [str(f.relative_to(ROOT)) for f in files if re.search(r"DESIGN(\.md| section)", f.read_text())]
    assert not cited, cited


def test_reading_the_numbers_is_short_and_states_the_a_a_rule():
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("## Reading the numbers")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = lines[start + 1:end]
    assert len(section) < READING_LINES, f"README.md: 'Reading the numbers' has {len(section)} lines"
    assert "A/A" in "\n".join(section), "README.md: 'Reading the numbers' does not state the A/A rule"


def test_top_readme_first_screen():
    """What it is, the two commands (and test-all), then the course map, then the milestones
    (generated), then the details; the full ladder lives on its own generated page."""
    text = (ROOT / "README.md").read_text()
    for needle in ("make run", "make test", "make test-all"):
        assert needle in text.split("## ")[0], f"README.md: {needle!r} is not in the opening"
    commands, index = text.find("```bash"), text.find("## Phases")
    milestones = text.find("<!-- results:milestones -->")
    assert 0 < commands < index < milestones < text.find("## Reading the numbers"), \
        "README.md: the commands, the course map, the milestones, then 'Reading the numbers'"
    assert "<!-- results:ladder -->" not in text and "(results/LADDER.md)" in text, "README.md: link the ladder page"
    assert not re.search(r"\b[0-9a-f]{12}\b", text), "README.md: run ids belong in results/, not here"


def test_top_readme_counts_the_built_phases():
    """The opening says how many phases exist: one linked row of the course map per phase folder."""
    text = (ROOT / "README.md").read_text()
    opening = text.split("## ")[0]
    assert re.search(rf"\b{len(PHASES)} phases are built\b", opening), f"README.md: say that {len(PHASES)} phases are built"
    linked = re.findall(r"^\| \d\d \| \[(p\d\d_\w+)\]\(phases/", text, re.M)
    assert linked == PHASES, "README.md: the course map links every built phase, and only those"
