"""The README and docs/: every relative link points at a file of the repository (and a heading of it, where the link
names one); the README stays a five-minute read with one figure of what a run gives."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target); the text may span lines
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def links(document: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", document.read_text()))


def anchor(heading: str) -> str:
    """GitHub's id of a heading: lower case, punctuation but hyphens and underscores dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(document: Path) -> set[str]:
    text = FENCE.sub("", document.read_text())
    return {anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def broken_links(document: Path) -> list[str]:
    broken = []
    for target in links(document):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not the repository's
            continue
        path, _, fragment = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        shown = file.relative_to(ROOT) if file.is_relative_to(ROOT) else file
        if not file.exists():
            broken.append(f"{target} (no file {shown})")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target} (no heading #{fragment} in {shown})")
    return broken


def test_every_relative_link_of_the_readme_and_docs_resolves():
    assert len(DOCUMENTS) > 5
    found = {str(d.relative_to(ROOT)): broken_links(d) for d in DOCUMENTS}
    assert {d: b for d, b in found.items() if b} == {}


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# A heading, with punctuation\n")
    document = tmp_path / "doc.md"
    document.write_text("[ok](other.md) [ok](other.md#a-heading-with-punctuation) [web](https://example.org/x)\n"
                        "[gone](missing.md) [no heading](other.md#nowhere)\n```\n[in code](ignored.md)\n```\n")
    assert [b.split(" ")[0] for b in broken_links(document)] == ["missing.md", "other.md#nowhere"]


def test_the_readme_is_short_and_shows_one_figure_of_a_run():
    text = (ROOT / "README.md").read_text()
    figures = [target for target in links(ROOT / "README.md") if target.endswith((".png", ".svg", ".jpg"))]
    assert len(text.splitlines()) <= 150 and len(figures) == 1
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    order = ["two commands", "What a run gives", "Your own data", "Experiments", "Read more"]
    assert [next(i for i, h in enumerate(headings) if part in h) for part in order] == sorted(
        next(i for i, h in enumerate(headings) if part in h) for part in order)
