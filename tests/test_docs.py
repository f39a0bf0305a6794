"""The documentation's shape and links. Checks that every relative link in README.md, docs/*.md,
benchmarks/RESULTS.md and COMPATIBILITY.md names a file that exists and, where it has a #fragment into a
markdown file, a heading there (GitHub's slug: lower case, punctuation dropped, spaces to hyphens, -1,
-2 ... for repeats); that the README stays a front door of at most 200 lines; that no README table cell
is over 160 characters and no table cell of any other tracked markdown file over 200 (the rest belongs
in prose under the table). Reference: the files in the checkout; `git ls-files` names the tracked ones
(a tree without git: every .md outside build folders). Only `git` is spawned."""
from __future__ import annotations

import pathlib
import re
import subprocess
from collections import Counter

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
README_CELL_MAX_CHARS = 160
DOC_CELL_MAX_CHARS = 200  # any other tracked .md: a longer cell goes into prose under its table


def checked_files() -> list[pathlib.Path]:
    files = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", ROOT / "COMPATIBILITY.md"]
    return files + sorted((ROOT / "docs").glob("*.md"))


def prose_lines(text: str):
    """(line number, line) outside fenced and indented code blocks, with inline code spans blanked, so
    that a link or heading shown as code is not taken for one."""
    fence, indented, previous_blank = None, False, True
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if fence:
            if marker and stripped.startswith(fence):
                fence = None
        elif marker:
            fence = marker.group(1)
        elif indented and (not stripped or line.startswith("    ")):
            pass
        elif previous_blank and line.startswith("    ") and stripped:
            indented = True  # an indented code block (a command) starts after a blank line
        else:
            indented = False
            yield number, re.sub(r"`+[^`]*`+", "``", line)
        previous_blank = not stripped


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lower case, every character that is not a
    letter, digit, space, hyphen or underscore dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    text = path.read_text()
    seen, found = Counter(), set()
    raw = text.splitlines()
    for number, _ in prose_lines(text):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", raw[number - 1])  # the heading as written, code included
        if m:
            base = slug(m.group(1))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    found |= set(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", text))  # explicit anchors
    return found


def links(path: pathlib.Path):
    """(line number, target) of every inline link or image and every reference definition."""
    for number, line in prose_lines(path.read_text()):
        for m in re.finditer(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            yield number, m.group(1)
        m = re.match(r"\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)", line)
        if m:
            yield number, m.group(1)


def is_external(target: str) -> bool:
    return bool(re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target))  # http:, https:, mailto: ...


def broken_links(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """One line per link whose file or anchor is missing, naming the file, line and target."""
    problems = []
    for number, target in links(path):
        if is_external(target):
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{where}: no heading with that anchor in {dest.name}")
    return problems


@pytest.mark.parametrize("path", checked_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert path.exists(), path
    assert broken_links(path) == []


def table_cells(row: str) -> list[str]:
    """The cells of a table row; a pipe inside a code span or escaped belongs to its cell."""
    cells, current, in_code, escaped = [], "", False, False
    for char in row.strip().strip("|"):
        if char == "|" and not in_code and not escaped:
            cells.append(current)
            current = ""
            continue
        in_code ^= char == "`"
        escaped = char == "\\" and not escaped
        current += char
    return cells + [current]


def test_docs_exist_and_the_readme_links_each():
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs, "docs/ holds the README's reference text"
    readme = (ROOT / "README.md").read_text()
    unlinked = [d.name for d in docs if f"docs/{d.name}" not in readme]
    assert unlinked == [], "docs not linked from the README"


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text to docs/"


def tracked_markdown(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Every markdown file git tracks under root; without git, every .md outside build folders."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", "--", "*.md"], cwd=root, capture_output=True,
                               check=True).stdout.decode().split("\0")
        return sorted(root / n for n in names if n and (root / n).exists())
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "node_modules", ".venv"}
        return sorted(p for p in root.rglob("*.md") if not skip & set(p.relative_to(root).parts))


def long_table_cells(path: pathlib.Path, limit: int, root: pathlib.Path = ROOT) -> list[str]:
    """One line per table cell of path longer than limit characters (as written, code spans included)."""
    too_long, text = [], path.read_text()
    raw_lines = text.splitlines()
    for number, line in prose_lines(text):
        if not line.lstrip().startswith("|"):
            continue
        for cell in table_cells(raw_lines[number - 1]):
            if len(cell.strip()) > limit:
                too_long.append(f"{path.relative_to(root)}:{number}: {len(cell.strip())} characters: "
                                f"{cell.strip()[:60]}...")
    return too_long


def test_no_readme_table_cell_is_too_long():
    assert long_table_cells(ROOT / "README.md", README_CELL_MAX_CHARS) == []


def test_no_docs_table_cell_is_too_long():
    files = tracked_markdown()
    assert ROOT / "docs" / "status.md" in files
    too_long = [line for path in files for line in long_table_cells(path, DOC_CELL_MAX_CHARS)]
    assert too_long == [], "move the rest of each cell into prose under its table"


def test_the_checks_can_fail(tmp_path):
    """The link check finds a missing file and a missing anchor, and the slugs are GitHub's."""
    (tmp_path / "a.md").write_text("# Status: what was verified `where`\n## Status: what was verified where\n"
                                   "[ok](#status-what-was-verified-where-1) [gone](missing.md) [bad](#nowhere)\n"
                                   "`[code](not-a-link.md)`\n\n    [indented](not-a-link-either.md)\n")
    problems = broken_links(tmp_path / "a.md", root=tmp_path)
    assert [p.split(": ")[1] for p in problems] == ["missing.md", "#nowhere"], problems
    assert slug("Training: `ringzero train`") == "training-ringzero-train"
    assert slug("Fused Adam (issue 4)") == "fused-adam-issue-4"
    assert slug("CUDA collectives: one H100 run of an older commit, fixes not yet run") == \
        "cuda-collectives-one-h100-run-of-an-older-commit-fixes-not-yet-run"
    (tmp_path / "b.md").write_text("| a | b |\n|---|---|\n| short | " + "x" * 201 + " |\n"
                                   "| `a|b` | " + "y" * 200 + " |\n\n```\n| " + "z" * 300 + " |\n```\n")
    assert [p.split(": ")[0] for p in long_table_cells(tmp_path / "b.md", 200, root=tmp_path)] == ["b.md:3"]
