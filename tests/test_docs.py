"""The documentation's Python examples run as they are printed (issue 27): every fenced ``python``
block of README.md and docs/*.md that follows a ``<!-- runnable -->`` line runs, in a process of its
own with a bound, against a real broker, and prints what the ``output`` block after it says.

The broker is the one README's quick start starts (``mc0 keys new alice && mc0 keys allow alice``,
``mc0 config sample journal.toml -o journal.toml``, ``mc0 broker --config journal.toml``, CURVE on),
in the folder the examples run from, with ``MC0_KEY``/``MC0_BROKER_KEY`` exported as README says.
The one liberty taken: the broker binds a free port, and ``tcp://127.0.0.1:61616`` in an example
is replaced by it (another process on the machine may hold 61616).  In an ``output`` block, ``...``
stands for any text (what differs between runs).  README's Python blocks must all be runnable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mc0.process import BrokerProcess

pytestmark = pytest.mark.timeout(120)  # an example's own bound (BOUND) and room to report it
ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- runnable -->"
DEFAULT_ENDPOINT = "tcp://127.0.0.1:61616"
BOUND = 60.0  # seconds one example may take (they take about one; room for a loaded machine)
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Example:
    where: str  # file:line of the code block
    code: str
    output: list[str] | None  # the lines the block must print (None: nothing)


def _fence(lines: list[str], start: int) -> tuple[str, list[str], int]:
    """The fenced block opening at ``start``: its info string, its lines, the index after it."""
    info = lines[start].strip()[3:].strip()
    body: list[str] = []
    i = start + 1
    while i < len(lines) and lines[i].strip() != "```":
        body.append(lines[i])
        i += 1
    if i == len(lines):
        raise AssertionError(f"unclosed code block at line {start + 1}")
    return info, body, i + 1


def examples_of(path: Path) -> tuple[list[Example], list[str]]:
    """The runnable examples of one document, and the problems found (a marker not before a python
    block; for README, a python block without the marker)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    name = path.relative_to(ROOT).as_posix()
    found: list[Example] = []
    problems: list[str] = []
    i = 0
    marked = False
    while i < len(lines):
        text = lines[i].strip()
        if text == MARKER:
            marked = True
            i += 1
            continue
        if text.startswith("```"):
            info, body, after = _fence(lines, i)
            if info == "python":
                if marked:
                    j = after
                    while j < len(lines) and not lines[j].strip():
                        j += 1
                    output = None
                    if j < len(lines) and lines[j].strip() == "```output":
                        _, output, after = _fence(lines, j)
                    found.append(Example(f"{name}:{i + 1}", "\n".join(body) + "\n", output))
                elif path.name == "README.md":
                    problems.append(f"{name}:{i + 1}: a python block in README without {MARKER}")
            elif marked:
                problems.append(f"{name}:{i + 1}: {MARKER} before a {info or 'plain'} block, not python")
            marked = False
            i = after
            continue
        if text and marked:
            problems.append(f"{name}:{i + 1}: {MARKER} not right before a code block")
            marked = False
        i += 1
    return found, problems


EXAMPLES = [example for path in DOCUMENTS for example in examples_of(path)[0]]


def test_the_markers_mark_python_blocks_and_readme_has_no_unmarked_example() -> None:
    problems = [problem for path in DOCUMENTS for problem in examples_of(path)[1]]
    assert not problems
    in_readme = [e for e in EXAMPLES if e.where.startswith("README.md:")]
    assert len(in_readme) >= 4 and all(e.output for e in in_readme)


def matches(expected: list[str], printed: list[str]) -> bool:
    """Line by line; ``...`` in an expected line stands for any text."""
    if len(expected) != len(printed):
        return False
    for want, got in zip(expected, printed, strict=True):
        pattern = ".*".join(re.escape(part) for part in want.split("..."))
        if not re.fullmatch(pattern, got):
            return False
    return True


@pytest.mark.parametrize(
    ("text", "expected", "ok"),
    [
        ("a\nb", ["a", "b"], True),
        ("ping 0.4 ms", ["ping ... ms"], True),
        ("ping 0.4 s", ["ping ... ms"], False),
        ("a", ["a", "b"], False),
        ("a\nb\nc", ["a", "b"], False),
        ("b'...'", ["b'...'"], True),
        ("x", [], False),
        ("", [], True),
    ],
)
def test_output_matching(text: str, expected: list[str], ok: bool) -> None:
    assert matches(expected, text.splitlines()) is ok


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, BrokerProcess]]:
    """README's quick start, in a folder of its own: alice's keys, the journal sample, the broker."""
    folder = tmp_path_factory.mktemp("quick-start")
    for command in (
        ("keys", "new", "alice"),
        ("keys", "allow", "alice"),
        ("config", "sample", "journal.toml", "-o", "journal.toml"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "mc0", *command], cwd=folder, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
    with BrokerProcess(config="journal.toml", cwd=str(folder)) as broker:
        yield folder, broker


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.where for e in EXAMPLES])
def test_each_runnable_example_runs_and_prints_what_the_document_says(
    example: Example, quick_start: tuple[Path, BrokerProcess]
) -> None:
    folder, broker = quick_start
    script = folder / "example.py"
    script.write_text(example.code.replace(DEFAULT_ENDPOINT, broker.endpoint), encoding="utf-8")
    env = {
        **os.environ,
        "MC0_KEY": "keys/alice.key_secret",
        "MC0_BROKER_KEY": "keys/broker.key",
        "MC0_ENDPOINT": broker.endpoint,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("MC0_CONFIG", None)
    try:
        done = subprocess.run(
            [sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=BOUND
        )
    except subprocess.TimeoutExpired as exc:  # (subprocess.run killed it)
        raise AssertionError(f"{example.where} still ran after {BOUND:g} s: {exc.stdout!r}") from None
    assert done.returncode == 0, f"{example.where} raised:\n{done.stderr[-3000:]}"
    assert not done.stderr.strip(), f"{example.where} wrote to stderr:\n{done.stderr[-3000:]}"
    printed = done.stdout.splitlines()
    assert matches(example.output or [], printed), f"{example.where} printed {printed}, expected {example.output}"
