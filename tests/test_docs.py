"""Every file, folder and link the documents name exists: README.md, docs/*.md, tests/README.md.

Two kinds of reference are checked:
- markdown links and images `[text](target)`: relative targets resolved from the document's
  folder (http(s) and mailto skipped); a `#anchor` must be a heading of the target document;
- repo paths in inline code: a word whose first component is one of the repository's top-level
  folders (`probes/runqueue.bpf.c`, `docs/serve.md`, `deploy/kubernetes/`), resolved from the
  repository root; a bare file name of the project's own kinds (`bench_collector.py`,
  `hist.bpf.h`, `analysis.md`) must be the name of some file in the repository.
Fenced code blocks and placeholders (`<name>.py`, `$DIR/x`, `...`) are not read as paths; globs
(`dashboards/generated/*.json`) must match something. Commands stay free text: `make demo`,
`tailsight serve --record DIR` and `/proc/pressure/*` name nothing of this repository.
"""

from __future__ import annotations

import fnmatch
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A bare name (no folder) with one of these endings must be some file of the repository. Other
# endings (`prometheus.yml`, `root-cause.html`) are names of the user's files.
PROJECT_SUFFIXES = (".py", ".c", ".h", ".md", ".sh", ".toml")
PLACEHOLDER = re.compile(r"[<>{}$…]|\.\.\.|^-")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", flags=re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", flags=re.MULTILINE)


def documents() -> list[Path]:
    """The documents a user reads: README.md, docs/*.md and tests/README.md where it exists."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    tests_readme = ROOT / "tests" / "README.md"
    return [*docs, tests_readme] if tests_readme.exists() else docs


def _ignored_names() -> list[str]:
    """Top-level patterns of .gitignore (`.venv/`, `build/`, `/demo-out/`): not the repo's own."""
    lines = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    return [line.strip().strip("/") for line in lines if line.strip() and line[0] != "#"]


@cache
def top_level_folders() -> frozenset[str]:
    ignored = [*_ignored_names(), ".git"]
    return frozenset(
        entry.name
        for entry in ROOT.iterdir()
        if entry.is_dir() and not any(fnmatch.fnmatch(entry.name, p) for p in ignored)
    )


@cache
def repo_file_names() -> frozenset[str]:
    """Names of every file under the top-level folders and at the top."""
    names = {entry.name for entry in ROOT.iterdir() if entry.is_file()}
    for folder in top_level_folders():
        names.update(path.name for path in (ROOT / folder).rglob("*") if path.is_file())
    return frozenset(names)


def without_fences(text: str) -> str:
    return FENCE.sub("", text)


def path_words(text: str) -> list[str]:
    """Words of inline code that name a file or folder of this repository."""
    found = []
    for match in INLINE_CODE.finditer(without_fences(text)):
        for word in match.group(2).split():
            word = word.strip(".,;:()[]'\"")
            if not word or PLACEHOLDER.search(word) or "://" in word:
                continue
            if names_repo_file(word):
                found.append(word)
    return found


def names_repo_file(word: str) -> bool:
    """A path under a top-level folder, or a bare file name of the project's own kinds."""
    if "/" in word:
        return word.split("/", 1)[0] in top_level_folders()
    return word.endswith(PROJECT_SUFFIXES) and "." in word[1:]


def path_exists(word: str) -> bool:
    if "/" not in word:
        return any(fnmatch.fnmatchcase(name, word) for name in repo_file_names())
    path = word.split("#", 1)[0].split(":", 1)[0]
    if any(c in path for c in "*?["):
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: inline markup dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(without_fences(doc.read_text(encoding="utf-8"))):
        anchor = github_anchor(match.group(1))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        out.add(anchor if count == 0 else f"{anchor}-{count}")
    return out


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def link_problems(doc: Path) -> list[str]:
    problems = []
    text = without_fences(doc.read_text(encoding="utf-8"))
    text = INLINE_CODE.sub("", text)
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^(https?:|mailto:)", target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc
        if not resolved.exists():
            problems.append(f"link {target}: {shown(resolved)} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"link {target}: no heading #{anchor} in {resolved.name}")
    return problems


def code_problems(doc: Path) -> list[str]:
    words = path_words(doc.read_text(encoding="utf-8"))
    return [f"`{word}` does not exist" for word in words if not path_exists(word)]


@pytest.mark.parametrize("doc", documents(), ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_named_file_exists(doc: Path) -> None:
    problems = link_problems(doc) + code_problems(doc)
    assert not problems, f"{doc.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


def test_the_checks_catch_a_made_up_path(tmp_path: Path) -> None:
    """The rules above find what they must and leave commands alone."""
    text = (
        "Run `make demo`, then `tailsight serve --record DIR` (`/proc/pressure/*`, `cpu.max`).\n"
        "See `probes/runqueue.bpf.c`, `python benchmarks/bench_hist.py --quick`, `hist.bpf.h`,\n"
        "`probes/<name>.py`, `prometheus.yml`, and the made-up `probes/nosuch.bpf.c` and\n"
        "`bench_nosuch.py`.\n\n```\ncat docs/nosuch.md\n```\n"
    )
    words = path_words(text)
    assert words == [
        "probes/runqueue.bpf.c",
        "benchmarks/bench_hist.py",
        "hist.bpf.h",
        "probes/nosuch.bpf.c",
        "bench_nosuch.py",
    ]
    assert [w for w in words if not path_exists(w)] == ["probes/nosuch.bpf.c", "bench_nosuch.py"]

    doc = tmp_path / "doc.md"
    doc.write_text("# A title\n[ok](#a-title) [gone](nosuch.md) [far](#nowhere)\n")
    assert link_problems(doc) == [
        f"link nosuch.md: {tmp_path / 'nosuch.md'} does not exist",
        "link #nowhere: no heading #nowhere in doc.md",
    ]
