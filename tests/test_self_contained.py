"""The project never points outside itself: a user who clones it has no ``../shared`` folder and no documents that
live beside the repository. Every document a README, study, module or preset cites must be in the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = [REPO / "README.md", REPO / "experiments", REPO / "src", REPO / "docs", REPO / "conf"]
TEXT = {".md", ".py", ".yaml", ".yml", ".txt", ".sh", ".toml", ".cfg", ".json", ".log"}
OUTSIDE = re.compile(r"\.\./shared|/work/shared|\bshared/(docs|papers)\b")
DOC = re.compile(r"\b([A-Z][A-Z0-9_-]*\.md)\b")  # DESIGN.md, ALGORITHMS.md, ...: a project document's name


def scanned_files() -> list[Path]:
    files = []
    for root in SCANNED:
        found = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        files += [p for p in found if p.suffix in TEXT and p.stat().st_size < 2_000_000]
    return files


def references(files: list[Path], known: set[str]) -> list[str]:
    """``path:line: text`` for every line that points outside the repository: the shared folder, or a capitalised
    document name (``NAME.md``) that no file in the repository has."""
    out = []
    for path in files:
        for n, text in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            missing = [d for d in DOC.findall(text) if d not in known]
            if OUTSIDE.search(text) or missing:
                out.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{n}: {text.strip()[:120]}")
    return out


def test_no_file_points_outside_the_repository():
    known = {p.name for p in REPO.rglob("*.md") if ".git" not in p.parts}
    found = references(scanned_files(), known)
    assert not found, "references to documents outside the repository (write them into docs/ instead):\n" + \
        "\n".join(found[:30])


def test_the_check_finds_outside_references(tmp_path):
    """The check itself can fail: a shared-folder path and an unknown document name are reported, a cluster path
    (``/shared/run``) and a document the repository has are not."""
    doc = tmp_path / "notes.md"
    doc.write_text("see ../shared/docs/x\nALGORITHMS.md §9\nhydra.run.dir=/shared/run\nthe README.md\n")
    found = references([doc], known={"README.md"})
    assert [f.split(":")[1] for f in found] == ["1", "2"]
