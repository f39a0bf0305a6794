"""The documentation's shape and links. Checks that every relative link in README.md, docs/*.md,
benchmarks/RESULTS.md and COMPATIBILITY.md names a file that exists and, where it has a #fragment into a
markdown file, a heading there (GitHub's slug: lower case, punctuation dropped, spaces to hyphens, -1,
-2 ... for repeats); that the README stays a front door of at most 130 lines; that no README table cell
is over 160 characters and no table cell of any other tracked markdown file over 200 (the rest belongs
in prose under the table); that no tracked text file cites a path of the repository that is not in it;
and that every "layer N" said anywhere is a layer docs/design.md defines. Reference: the files in the
checkout; `git ls-files` names the tracked ones (a tree without git: every file outside build folders).
Only `git` is spawned."""
from __future__ import annotations

import pathlib
import fnmatch
import re
import subprocess
from collections import Counter

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README_MAX_LINES = 130
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


def tracked_files(root: pathlib.Path = ROOT) -> list[str]:
    """Every file git tracks under root, as repository-relative posix paths; without git, every file
    outside build folders."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True,
                               check=True).stdout.decode().split("\0")
        return sorted(n for n in names if n and (root / n).is_file())
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "node_modules", ".venv", "__pycache__"}
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                      if p.is_file() and not skip & set(p.relative_to(root).parts))


def tracked_markdown(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    return [root / n for n in tracked_files(root) if n.endswith(".md")]


def tracked_text(root: pathlib.Path = ROOT):
    """(path, text) of every tracked file that reads as UTF-8 text."""
    for name in tracked_files(root):
        try:
            yield name, (root / name).read_text()
        except UnicodeDecodeError:
            continue  # images and other binary files


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


# ---- every cited path exists -----------------------------------------------------------------------

PATH_ROOTS = ("csrc", "python", "tests", "tools", "benchmarks", "docs", "cmake")
# A path is cited when it starts at one of PATH_ROOTS (not inside an absolute or longer path) or ends in
# .md. {a,b} names each of a and b; <...>, $VAR and the words below stand for a part of a name and
# match as a glob, as * does.
_PART = r"(?:[\w.*/<>$-]|\{[^}\s]*\})"
CITED_PATH = re.compile(r"(?<![\w./$-])((?:%s)/%s*(?:[\w*/>]|\{[^}\s]*\})|(?:[\w.<>$-]|\{[^}\s]*\})%s*\.md)(?![\w])"
                        % ("|".join(PATH_ROOTS), _PART, _PART))
PLACEHOLDER = re.compile(r"<[^>/]*>|\$\{?\w*\}?|\b(?:DATE|NAME|RUN|TAG)\b")
# Not checked: this file (its self-test names missing paths on purpose), and the raw output of runs
# under benchmarks/results other than their READMEs, kept as the tools printed them (an --out prefix
# renamed after the run stays as it was given).
NOT_CHECKED = ("tests/house/test_docs.py",)


def cited_paths(text: str):
    """(line number, path) of every repository path the text names."""
    for number, line in enumerate(text.splitlines(), 1):
        for m in CITED_PATH.finditer(line):
            yield number, m.group(1)


def brace_expanded(cited: str) -> list[str]:
    """run{0,1}.md -> run0.md, run1.md (every group, left to right)."""
    m = re.search(r"\{([^{}]*)\}", cited)
    if not m:
        return [cited]
    return [x for alt in m.group(1).split(",") for x in brace_expanded(cited[:m.start()] + alt + cited[m.end():])]


def path_exists(cited: str, source: str, files: set[str], folders: set[str]) -> bool:
    """Whether `cited`, named in tracked file `source`, is a tracked file or folder (each of its brace
    alternatives): from the root or from source's folder; with a placeholder or *, as a glob that must
    match one; also a stem whose file exists (an output prefix like results/run3 for run3.json, or
    tests/cuda_util.run_script, a name in tests/helpers/cuda_util.py); a bare NAME.md anywhere in the tree."""
    return all(_one_path_exists(c, source, files, folders) for c in brace_expanded(cited))


def _one_path_exists(cited: str, source: str, files: set[str], folders: set[str]) -> bool:
    pattern = PLACEHOLDER.sub("*", cited).rstrip("/")
    bases = [pathlib.PurePosixPath(pattern)]
    if "/" in source:
        bases.append(pathlib.PurePosixPath(source).parent / pattern)
    for base in bases:
        parts = []
        for part in base.parts:  # resolve "..", textually
            if part == "..":
                if not parts:
                    break
                parts.pop()
            elif part != ".":
                parts.append(part)
        else:
            path = "/".join(parts)
            stems = [path, path.rsplit(".", 1)[0]] if "." in path.rsplit("/", 1)[-1] else [path]
            if "*" in path:
                if any(fnmatch.fnmatchcase(f, path) for f in files | folders):
                    return True
            elif path in files or path in folders:
                return True
            if any(f.startswith(stem + ".") for stem in stems for f in files):
                return True
    return "/" not in cited and any(f.rsplit("/", 1)[-1] == cited for f in files)


def missing_paths(root: pathlib.Path = ROOT) -> list[str]:
    files = set(tracked_files(root))
    folders = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    missing = []
    for name, text in tracked_text(root):
        if name in NOT_CHECKED or (name.startswith("benchmarks/results/") and not name.endswith(".md")):
            continue
        fixture_test = name.startswith("tests/") and name.rsplit("/", 1)[-1].startswith("test_")  # a bare x.md there is a file the test writes
        for number, cited in cited_paths(text):
            if fixture_test and "/" not in cited:
                continue
            if not path_exists(cited, name, files, folders):
                missing.append(f"{name}:{number}: {cited}")
    return missing


def test_every_cited_path_is_in_the_repository():
    assert missing_paths() == [], "cite files that are in the repository (or say the name is an example)"


# ---- layers are defined in docs/design.md -----------------------------------------------------------

LAYER_WORD = re.compile(r"(?<![\w-])layers?[ -](\d+)(?:\s*(?:-|to|and)\s*(\d+))?", re.IGNORECASE)


def defined_layers(design: str) -> set[int]:
    """The layer numbers of docs/design.md's layer table: rows whose first cell is 'N name'."""
    return {int(m.group(1)) for m in re.finditer(r"^\| (\d+) [a-z]+ \|", design, re.MULTILINE)}


def used_layers(text: str) -> set[int]:
    used = set()
    for m in LAYER_WORD.finditer(text):
        first = int(m.group(1))
        used.update(range(first, int(m.group(2) or first) + 1))
    return used


def test_every_layer_named_is_defined_in_the_design_page():
    defined = defined_layers((ROOT / "docs" / "design.md").read_text())
    assert defined == set(range(1, max(defined) + 1)), defined
    undefined = {f"{name}: layer {n}" for name, text in tracked_text() for n in used_layers(text) - defined}
    assert undefined == set(), "define the layer in docs/design.md or say what is meant"


def test_the_path_and_layer_checks_can_fail(tmp_path):
    files = {"docs/design.md", "docs/status.md", "tests/helpers/cuda_util.py", "benchmarks/results/run3.json",
             "benchmarks/results/run-2026-11-25.json",
             "tests/cpp/test_cuda.cu"}
    folders = {"docs", "tests", "tests/cpp", "benchmarks", "benchmarks/results"}
    text = ("see docs/DESIGN.md, docs/design.md, ../README.md, `csrc/gone.h`, tests/cpp/test_*.cu, "
            "tests/cpp/test_${t}.cu, benchmarks/results/run-DATE.json, benchmarks/results/run3, "
            "tests/helpers/cuda_util.run_script, status.md, /abs/tools/x.py, tools/<name>.sh, docs/{design,gone}.md\n")
    cited = [c for _, c in cited_paths(text)]
    assert "tools/x.py" not in cited, "a path inside an absolute one is not a repository path"
    missing = [c for c in cited if not path_exists(c, "docs/cuda.md", files, folders)]
    assert missing == ["docs/DESIGN.md", "../README.md", "csrc/gone.h", "tools/<name>.sh", "docs/{design,gone}.md"]
    assert used_layers("layer 2's kernels; layers 1-3; Layer 8: tools; layer-4; --layers 48") == {1, 2, 3, 4, 8}
    assert defined_layers("| 1 core | x |\n| 2 cuda | y |\n| layer | folder |\n") == {1, 2}
