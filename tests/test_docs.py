"""The repository stands alone: docs and code point only inside it, every cited docs/*.md exists, and
every "SPEC N" citation names a section of docs/SPEC.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".md", ".py", ".sh", ".toml", ""}
# Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile("|".join([r"\.\./" + "shared", "shared/" + "SPEC", "/work/" + "shared", "make-" + "bundle"]))
ISSUE = re.compile(r"\b[Ii]ssue" + r"s? #?\d+")
DOC_PATH = re.compile(r"\bdocs/[A-Za-z0-9_-]+\.md\b")
CITATION = re.compile(r"\bSPEC (?:section |sections )?(D\d+|\d+(?:\.\d+)?)")
# A doc and the section it names: docs/PERFORMANCE.md, "Tuning" / docs/TUNING.md ("Results committed")
SECTION_CITATION = re.compile(r'\b(docs/[A-Za-z0-9_-]+\.md|README\.md)[,:]?\s+\(?"([^"]{3,100})"')


def tracked_text_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [ROOT / n for n in names if (ROOT / n).is_file()]
    return [p for p in paths if p.suffix in TEXT_SUFFIXES and not p.name.endswith(".json")]


def test_nothing_points_outside_the_repository():
    offenders = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in tracked_text_files()
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert offenders == []


def test_docs_do_not_cite_issues():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    offenders = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in docs
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert offenders == []


def test_cited_docs_exist():
    missing = sorted({
        f"{p.relative_to(ROOT)} cites {m}"
        for p in tracked_text_files()
        for m in DOC_PATH.findall(p.read_text(errors="replace"))
        if not (ROOT / m).is_file()
    })
    assert missing == []


def spec_sections() -> set[str]:
    text = (ROOT / "docs" / "SPEC.md").read_text()
    numbered = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[. ]", text, re.MULTILINE))
    items = set(re.findall(r"^(D\d+)\. ", text, re.MULTILINE))
    return numbered | items


def test_spec_citations_name_existing_sections():
    sections = spec_sections()
    assert {"0", "1.4", "3.2", "4", "6", "D1", "D9"} <= sections
    unknown = sorted({
        f"{p.relative_to(ROOT)}: SPEC {s}"
        for p in tracked_text_files()
        for s in CITATION.findall(p.read_text(errors="replace"))
        if s not in sections
    })
    assert unknown == []


def headings(doc: Path) -> list[str]:
    names = re.findall(r"^#+ (.*)$", doc.read_text(), re.MULTILINE)
    return [" ".join(h.replace("`", "").split()).lower() for h in names]


def test_cited_sections_exist_or_are_retired():
    """A doc cited with a section name in quotes has a heading holding that name, unless the citation
    says where the retired text is (``git show REV:PATH`` right after it)."""
    missing = []
    for p in tracked_text_files():
        if p.parent.name == "tests":
            continue
        text = p.read_text(errors="replace")
        for m in SECTION_CITATION.finditer(text):
            doc, name = ROOT / m.group(1), " ".join(m.group(2).split()).lower()
            retired = "git show" in text[m.end():m.end() + 160]
            if doc.is_file() and not retired and not any(name in h for h in headings(doc)):
                missing.append(f"{p.relative_to(ROOT)} cites {m.group(1)} \"{m.group(2)}\"")
    assert missing == []
