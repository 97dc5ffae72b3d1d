"""The README and docs/ (not docs/history/, the dated record): every relative link points at a file of the repository
(and a heading of it, where the link names one), every repository path they name exists, and every module, function
or class they name as `package.module.name` is there; the README stays a five-minute read with one figure of what a
run gives."""
from __future__ import annotations

import ast
import re
from functools import cache
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


# The repository's top-level folders: a path the docs name starts with one of them. A token that only contains one
# further in (`outputs/bert_tiny/...`, `~/.cache/textrep/stages/...`, `$OUT/tests/...`, a URL) is not a repository path.
ROOTS = ("benchmarks", "conf", "conventions", "data_prep", "docs", "hydra_plugins", "models", "pipeline", "tasks",
         "tests", ".ci")
PACKAGES = ("pipeline", "models", "data_prep", "conventions", "benchmarks", "hydra_plugins")
# A path token: what is left of a word once quotes, brackets, commas and the like end it
TOKEN = re.compile(r"(?<![\w./~$@-])(?:%s)/[^\s`'\"()\[\],;]*" % "|".join(re.escape(r) for r in ROOTS))
# A dotted name rooted in a package: `pipeline.engine.dag.plan`, `models.seq2seq.bart_config`
DOTTED = re.compile(r"(?<![\w./~$@-])(?:%s)(?:\.[A-Za-z_]\w*)+" % "|".join(PACKAGES))
PLACEHOLDER = re.compile(r"[<>*?{}$|…]|\.\.\.")  # pipeline/<family>/, **/*.txt, conf/experiment/…, tests/...


def named_paths(text: str) -> set[str]:
    """The repository paths a document names, wherever it names them (prose, backticks, code blocks, link targets
    written from the root), without a line number (`:12`), a test id (`::test_x`), an anchor or the sentence's
    punctuation; a path with a placeholder or a glob in it names no one file and is left out."""
    found = set()
    for token in TOKEN.findall(text):
        token = re.split(r"::|#|:\d", token)[0].rstrip(".:")
        if not PLACEHOLDER.search(token):
            found.add(token)
    return found


@cache
def top_level_names(module: Path) -> dict[str, ast.AST]:
    """What `module` defines or imports at its top level (inside `if`/`try` too), each with its node."""
    names: dict[str, ast.AST] = {}
    body = list(ast.parse(module.read_text()).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *node.orelse, *getattr(node, "handlers", []), *getattr(node, "finalbody", [])]
        elif isinstance(node, ast.ExceptHandler):
            body += node.body
    return names


def missing_dotted(name: str, root: Path = ROOT) -> str | None:
    """Why `name` (`pipeline.engine.dag.plan`) is not in the repository, or None where it is: its modules are files or
    packages, and what follows them is a name the last module defines (and, for a class, one of its attributes).
    `pipeline.force`, `pipeline.stages`, ...: the `pipeline` block's settings share the package's name, so a name whose
    second part is no module of pipeline/ is taken for a setting, not checked."""
    parts = name.split(".")
    module, i = root / parts[0], 1
    while i < len(parts) and ((module / parts[i]).is_dir() or (module / f"{parts[i]}.py").is_file()):
        module, i = module / parts[i], i + 1
    if parts[0] == "pipeline" and i == 1:
        return None
    file = module / "__init__.py" if module.is_dir() else module.with_suffix(".py")
    if i == len(parts):
        return None
    if not file.is_file():
        return f"{name} (no module {file.relative_to(root)})"
    node = top_level_names(file).get(parts[i])
    if node is None:
        return f"{name} (no {parts[i]} in {file.relative_to(root)})"
    if isinstance(node, ast.ClassDef) and i + 1 < len(parts):
        members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        members |= {t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in ast.walk(n.targets[0] if isinstance(n, ast.Assign) else n.target)
                    if isinstance(t, ast.Name)}
        if parts[i + 1] not in members:
            return f"{name} (no {parts[i + 1]} in class {parts[i]} of {file.relative_to(root)})"
    return None


def missing_names(document: Path, root: Path = ROOT) -> list[str]:
    """The paths and dotted names `document` names that the repository at `root` lacks."""
    text = document.read_text()
    missing, dotted = [], set(DOTTED.findall(text))
    for path in sorted(named_paths(text)):
        module, _, name = path.rpartition(".")
        if (root / path).exists():
            continue
        if module and (root / f"{module}.py").is_file():  # `tests/helpers.start_session_ray`: a name in a module
            dotted.add(f"{module.replace('/', '.')}.{name}")
        else:
            missing.append(f"{path} (no such file or folder)")
    for name in sorted(dotted):
        why = missing_dotted(name.rstrip("."), root)
        if why:
            missing.append(why)
    return missing


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


def test_every_path_and_name_the_readme_and_docs_give_exists():
    found = {str(d.relative_to(ROOT)): missing_names(d) for d in DOCUMENTS}
    assert {d: m for d, m in found.items() if m} == {}


def test_the_path_check_names_what_is_missing_and_nothing_else(tmp_path):
    (tmp_path / "pipeline" / "engine").mkdir(parents=True)
    (tmp_path / "pipeline" / "engine" / "dag.py").write_text("def plan():\n    pass\n\n\nclass Stage:\n    name = 1\n")
    (tmp_path / "models").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "helpers.py").write_text("def start():\n    pass\n")
    document = tmp_path / "doc.md"
    document.write_text(
        "The DAG (`pipeline/engine/dag.py:12`, pipeline/engine/dag.py's `plan`, tests in `pipeline/engine/`) and\n"
        "`pipeline/engine/gone.py`; `models/kernels.py::test_x`. `pipeline.engine.dag.plan`,\n"
        "`pipeline.engine.dag.Stage.name`, `pipeline.engine.dag.Stage.gone`, `pipeline.engine.dag.nothing`,\n"
        "`pipeline.force=[x]`, `pipeline.gone.thing`.\n"
        "Not paths: https://github.com/o/r/blob/main/pipeline/x.py, `$OUT/pipeline/y.py`, outputs/bert_tiny/<date>/,\n"
        "`~/.cache/textrep/stages/<stage>/`, `**/*.txt`, `pipeline/<family>/`, `conf/experiment/…`, `tests/...`,\n"
        "../shared/data/models/x, `finetune.models`, TEXTREP/docs/x.md. `tests/helpers.start`, `tests/helpers.stop`.\n")
    assert missing_names(document, tmp_path) == [
        "models/kernels.py (no such file or folder)", "pipeline/engine/gone.py (no such file or folder)",
        "pipeline.engine.dag.Stage.gone (no gone in class Stage of pipeline/engine/dag.py)",
        "pipeline.engine.dag.nothing (no nothing in pipeline/engine/dag.py)",
        "tests.helpers.stop (no stop in tests/helpers.py)"]


def test_the_readme_is_short_and_shows_one_figure_of_a_run():
    text = (ROOT / "README.md").read_text()
    figures = [target for target in links(ROOT / "README.md") if target.endswith((".png", ".svg", ".jpg"))]
    assert len(text.splitlines()) <= 150 and len(figures) == 1
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    order = ["two commands", "What a run gives", "Your own data", "Experiments", "Read more"]
    assert [next(i for i, h in enumerate(headings) if part in h) for part in order] == sorted(
        next(i for i, h in enumerate(headings) if part in h) for part in order)
