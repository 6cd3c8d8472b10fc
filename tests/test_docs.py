"""The README and docs/*.md cannot drift from the code: their runnable code blocks run, and their links resolve.

A fenced block is runnable when the line right before its opening fence is one of these HTML comments (invisible
on GitHub); options combine with ";", as in `<!-- runnable: slow; fixture study runs/x -->`:

    <!-- runnable -->                      fast tier: run it; it must finish in a few seconds
    <!-- runnable: slow -->                slow tier (@pytest.mark.slow): real training, evaluation, export
    <!-- runnable: file PATH -->           not run: written to PATH (relative) in the work folder of every runnable
                                           block of the same document, so a later block can use it
    <!-- runnable: fixture study PATH -->  first build a synthetic finished study at PATH (report_fixtures.py)
    <!-- runnable: fixture grid PATH -->   first build a synthetic grid() sweep at PATH

Each block gets a fresh work folder holding copies of experiments/ and tests/experiments/, so relative paths read
as in a checkout and whatever the block writes (runs/, exports) stays in the folder. `python` blocks run with this
Python; `bash`/`sh` blocks with `bash -e -o pipefail`; both with this Python's bin/ first on PATH,
OMP_NUM_THREADS=1 and the session's ABLATE_CACHE (conftest.py). One test per block, its id `file:line` of the
opening fence. docs/architecture.md ("Tests and these docs") says the same for writers of docs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from report_fixtures import build_grid_experiment, build_toy_experiment

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 230  # "about 200": the README is a front door; the manual lives in docs/
MARKER = re.compile(r"<!--\s*runnable\b(.*?)-->")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
LANGUAGES = {"python": "python", "bash": "bash", "sh": "bash"}
FIXTURES = {"study": build_toy_experiment, "grid": build_grid_experiment}
TIMEOUT = {"fast": 120, "slow": 1800}


@dataclass
class Block:
    doc: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    tier: str = "fast"  # fast, slow, or file (not run)
    file: str | None = None
    fixtures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _options(block: Block, text: str) -> list[str]:
    """Apply a marker's options to `block`; the problems found."""
    problems = []
    for option in (part.strip() for part in text.split(";")):
        words = option.split()
        if not words:
            continue
        if words == ["slow"]:
            block.tier = "slow"
        elif words[0] == "file" and len(words) == 2:
            block.tier, block.file = "file", words[1]
        elif words[0] == "fixture" and len(words) == 3 and words[1] in FIXTURES:
            block.fixtures.append((words[1], words[2]))
        else:
            problems.append(
                f"{block.id}: marker option {option!r}; allowed: slow, file PATH, "
                f"fixture {{{', '.join(FIXTURES)}}} PATH"
            )
    return problems


def _parse(path: Path) -> tuple[list[Block], list[str]]:
    """The marked blocks of one document, and what is wrong with its markers."""
    doc, lines = str(path.relative_to(REPO)), path.read_text().splitlines()
    blocks, problems, i = [], [], 0
    while i < len(lines):
        marker = MARKER.fullmatch(lines[i].strip())  # a whole line: a marker quoted in prose is not one
        i += 1
        if not marker:
            continue
        fence = FENCE.match(lines[i]) if i < len(lines) else None
        if not fence:
            problems.append(f"{doc}:{i}: a runnable marker must be the line right before a fenced code block")
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1))), None)
        if end is None:
            problems.append(f"{doc}:{i + 1}: the fenced block never closes")
            break
        block = Block(doc, i + 1, fence.group(2), "\n".join(lines[i + 1 : end]) + "\n")
        options = marker.group(1).strip()
        if options and not options.startswith(":"):
            problems.append(f"{doc}:{i}: write options after a colon, as in <!-- runnable: slow -->")
        problems += _options(block, options.lstrip(":"))
        if block.tier != "file" and block.language not in LANGUAGES:
            problems.append(
                f"{block.id}: a runnable block's language is {block.language!r}; allowed: "
                f"{', '.join(LANGUAGES)} (or mark it `file PATH`)"
            )
        blocks.append(block)
        i = end + 1
    return blocks, problems


PARSED = {path: _parse(path) for path in DOCS}
BLOCKS = [block for blocks, _ in PARSED.values() for block in blocks]
MARKER_PROBLEMS = [problem for _, problems in PARSED.values() for problem in problems]


def _param(block: Block):
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if block.tier == "slow" else [])


def test_markers_are_well_formed():
    assert not MARKER_PROBLEMS, "\n".join(MARKER_PROBLEMS)
    tiers = {block.tier for block in BLOCKS}
    assert {"fast", "slow", "file"} <= tiers, f"the docs lost a tier of runnable blocks: only {sorted(tiers)}"


def _work_folder(tmp_path: Path, block: Block) -> Path:
    work = tmp_path / "work"
    shutil.copytree(REPO / "experiments", work / "experiments")
    shutil.copytree(REPO / "tests" / "experiments", work / "tests" / "experiments")
    for other in BLOCKS:
        if other.doc == block.doc and other.tier == "file":
            target = (work / other.file).resolve()
            assert target.is_relative_to(work.resolve()), f"{other.id}: file {other.file} is outside the work folder"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(other.code)
    for kind, where in block.fixtures:
        FIXTURES[kind](work / where)
    return work


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.tier != "file"])
def test_runnable_block(block: Block, tmp_path: Path):
    work = _work_folder(tmp_path, block)
    language = LANGUAGES[block.language]
    script = work / ("_doc_block.py" if language == "python" else "_doc_block.sh")
    script.write_text(block.code)
    command = [sys.executable, script.name] if language == "python" else ["bash", "-e", "-o", "pipefail", script.name]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    try:
        result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT[block.tier])
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"{block.id}: still running after {TIMEOUT[block.tier]} s (a fast block must take seconds; "
            f"mark a longer one `runnable: slow`)"
        )
    if result.returncode != 0:
        pytest.fail(
            f"{block.id}: exit {result.returncode}\n--- block\n{block.code}--- stdout (end)\n"
            f"{result.stdout[-3000:]}\n--- stderr (end)\n{result.stderr[-3000:]}"
        )


@pytest.mark.parametrize(
    "block", [pytest.param(b, id=b.id) for b in BLOCKS if b.tier == "file" and LANGUAGES.get(b.language) == "python"]
)
def test_file_block_compiles(block: Block):
    compile(block.code, f"{block.id} ({block.file})", "exec")


# ---------------------------------------------------------------------------------------------------------------
# links


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans, line numbers kept."""
    lines, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            lines.append("")
        elif fence is not None:
            fence = None if line.startswith(fence) else fence
            lines.append("")
        else:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for line in _prose(path.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(doc: Path):
    broken = []
    for number, line in enumerate(_prose(doc.read_text()).splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:: not checked offline
                continue
            path_part, _, anchor = target.partition("#")
            linked = (doc.parent / path_part).resolve() if path_part else doc
            where = f"{doc.relative_to(REPO)}:{number}: {target}"
            if not linked.exists():
                broken.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{where}: no heading #{anchor} in {linked.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_slug_follows_github():
    assert slug("ablate plan's memory model") == "ablate-plans-memory-model"
    assert slug("Which signal to trust at which scale (measured)") == "which-signal-to-trust-at-which-scale-measured"
    assert slug("Recipes: branches, batch-size `schedules`") == "recipes-branches-batch-size-schedules"


# ---------------------------------------------------------------------------------------------------------------
# the README as a front door


def test_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    lines = readme.count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail to docs/ and link it"
    )
    unlinked = [p.name for p in DOCS[1:] if f"(docs/{p.name}" not in readme]
    assert not unlinked, f"README.md links no docs/{unlinked}: every page of docs/ is reachable from the front door"


def test_ci_runs_the_readme_commands():
    """CI (.ci/run) sets up a venv exactly as the README's first command does, then runs its test command."""
    readme = (REPO / "README.md").read_text()
    setup = next(line for line in readme.splitlines() if line.startswith("python3 -m venv .venv"))
    ci = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    installs = [line.replace(" -q", "") for line in ci if line.startswith(".venv/bin/pip install")]
    assert installs and all(step in setup for step in installs), (installs, setup)
    test_command = ".venv/bin/python -m pytest -q -n auto --dist worksteal --durations=15"  # all tests, all cores
    assert f"```bash\n{test_command}\n```" in readme
    assert test_command in ci
