"""README.md, CONTRIBUTING.md, docs/, configs/, src/privret/, bench/ (not bench/results/) and tests/ say what the
project does now; the story of its making belongs in commit messages. The rules below name what is refused.

Each rule is a regular expression over one line; a few legitimate phrases are allowed explicitly (pytest's session
scope, a process session, a date inside a URL). This file is left out of the scan: it has to spell the patterns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve()

# what is scanned: single files and folders, relative to the repository root
SCANNED_FILES = ("README.md", "CONTRIBUTING.md")
SCANNED_DIRS = ("docs", "configs", "src/privret", "bench", "tests")
# folders left out: measurement outputs and caches
SKIPPED_DIRS = ({"bench", "results"}, {"__pycache__"}, {".pytest_cache"})
# text files written by people; .tsv, .json and .jsonl files here are data
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt"}
MIN_FILES = 100  # the tree holds well over this many; fewer means the scan lost its way

# the rules spell the words in pieces, so that a search of the tree for them does not land here
_SESSION = "ses" + "sion"
_ISSUE = "iss" + "ue"

RULES: dict[str, re.Pattern[str]] = {
    # "issue 12", "issues 11 and 12", "Issue 12's", "issue 15 point 4", "(issue 3)"
    "issue number": re.compile(rf"\b{_ISSUE}s?\s*#?\d+", re.IGNORECASE),
    # "#12" as a reference: not a CSS colour (color:#222; solid #fff4e5), a markdown anchor (#2-setup) or $#
    "issue reference": re.compile(r"(?<![\w&/#:$.{'\"])#\d{1,4}\b(?![-\w;}])"),
    # a work session: "fifth session", "this session", "sessions"; legitimate uses are allowed below
    "work session": re.compile(rf"\b{_SESSION}s?\b", re.IGNORECASE),
    # a date of work; allowed on a line with a URL (a dataset's or a paper's address)
    "date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    # a lent or loaned machine
    "lent machine": re.compile(r"\b(?:le" + r"nt|loa" + r"ned)\b", re.IGNORECASE),
    # a path of the development machine
    "development path": re.compile(r"(?<![\w.~])/(?:wo" + r"rk|ro" + r"ot)/|/tmp/bash" + r"_jobs"),
    # goal bookkeeping: "goal met", "goal not met", "not met", "unmet", "Status: met"
    "goal language": re.compile(
        r"\bgoals?\s+(?:is\s+|was\s+|were\s+|are\s+)?(?:not\s+)?m" + r"et\b|\bnot\s+m" + r"et\b|\bunm" + r"et\b"
        r"|\bstatus:\s*\**\s*(?:not\s+)?m" + r"et\b",
        re.IGNORECASE),
    # history narratives: "it used to", "before this was fixed", "today it needs", "when this page was written"
    "history narrative": re.compile(
        r"\b(?:it|they|this|that|which)\s+us" + r"ed\s+to\b|\bbefore\s+this\s+was\s+fix" + r"ed\b|\btod" + r"ay\b"
        r"|\bwhen\s+this\s+(?:page|section|file|table)\s+was\s+writ" + r"ten\b",
        re.IGNORECASE),
}

# legitimate phrases, removed from a line before the rules run (each precise, none a whole word alone)
ALLOWED: dict[str, re.Pattern[str]] = {
    "work session": re.compile(
        rf"scope\s*=\s*[\"']{_SESSION}[\"']"  # @pytest.fixture(scope="session")
        rf"|\bpytest\s+{_SESSION}\b"  # the pytest session (one test run)
        rf"|\b{_SESSION}[- ]scoped\b|\b{_SESSION}\s+fixtures?\b"  # pytest's fixture scope
        rf"|\bprocess\s+{_SESSION}s?\b",  # a Unix process session (setsid)
        re.IGNORECASE),
    "date": re.compile(r"^.*https?://.*$"),
}


def hits_in_text(text: str) -> list[tuple[int, str, str]]:
    """(line number, rule, line) for every rule a line of ``text`` breaks."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for rule, pattern in RULES.items():
            checked = ALLOWED[rule].sub(" ", line) if rule in ALLOWED else line
            if pattern.search(checked):
                found.append((number, rule, line.strip()))
    return found


def scanned_files() -> list[Path]:
    """The text files the rules apply to."""
    files = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for folder in SCANNED_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if (path.is_file() and path.suffix in TEXT_SUFFIXES and path.resolve() != THIS_FILE
                    and not any(skipped <= parts for skipped in SKIPPED_DIRS)):
                files.append(path)
    return files


def test_the_scanner_flags_each_rule_and_spares_the_allowed_phrases():
    session, issue = _SESSION, _ISSUE
    planted = {
        "issue number": [f"as {issue} 12 asks", f"({issue} 3)", f"{issue} 15 point 4", f"{issue}s 11 and 12"],
        "issue reference": ["fixed in #12.", "see (#7)"],
        "work session": [f"the thirty-eighth {session}", f"this {session}", f"over two {session}s"],
        "date": ["measured on 2026-12-01", "since 2026-11-26"],
        "lent machine": ["on a le" + "nt GPU", "the loa" + "ned machine"],
        "development path": ["/wo" + "rk/main/runs/x", "/tmp/bash" + "_jobs.0/1", "/ro" + "ot/.cache"],
        "goal language": ["goal m" + "et", "goal not m" + "et", "Status: **m" + "et**", "reported as unm" + "et"],
        "history narrative": ["it us" + "ed to fail", "before this was fix" + "ed", "tod" + "ay it needs a flag",
                              "when this page was writ" + "ten"],
    }
    for rule, samples in planted.items():
        for sample in samples:
            assert rule in {hit[1] for hit in hits_in_text(sample)}, (rule, sample)
    allowed = [
        f'@pytest.fixture(scope="{session}")', f"once per pytest {session}", f"a {session}-scoped fixture",
        f"{session} fixtures included", f"in a process {session} of its own", "body{color:#222;background:#fff4e5}",
        "border-left:4px solid #f0a020", "[setup](#2-setup)", "see https://example.org/2024-01-01/data",
        "the key used to sign", "a silent failure", "the network/work/ folder", "x = arr[0]  # 1 row",
    ]
    for sample in allowed:
        assert hits_in_text(sample) == [], sample


def test_the_scan_reaches_every_area():
    files = scanned_files()
    assert len(files) >= MIN_FILES, len(files)
    relative = {path.relative_to(ROOT).as_posix() for path in files}
    assert "README.md" in relative
    for folder in ("docs/", "src/privret/", "bench/", "tests/"):
        assert any(name.startswith(folder) for name in relative), folder
    assert not any(name.startswith("bench/results/") for name in relative)


@pytest.mark.parametrize("area", ["README.md, CONTRIBUTING.md", *SCANNED_DIRS])
def test_no_word_of_how_the_project_was_developed(area):
    prefixes = tuple(name.strip() for name in area.split(","))
    found = []
    for path in scanned_files():
        name = path.relative_to(ROOT).as_posix()
        if name in prefixes or name.startswith(tuple(prefix + "/" for prefix in prefixes)):
            for number, rule, line in hits_in_text(path.read_text(encoding="utf-8")):
                found.append(f"{name}:{number}: [{rule}] {line[:160]}")
    if found:
        pytest.fail(f"{len(found)} line(s) tell how the project was developed:\n" + "\n".join(found), pytrace=False)
