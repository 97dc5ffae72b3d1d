"""The layers stay apart: models/ imports neither data_prep/ nor pipeline/; the constants they share are defined
once."""
from __future__ import annotations

import ast
import inspect
import io
import tokenize
from pathlib import Path

import torch.nn.functional as F

from models import IGNORE_INDEX

ROOT = Path(__file__).resolve().parent.parent


def _imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.append(node.module)
    return modules


def test_models_import_neither_data_prep_nor_pipeline():
    files = sorted((ROOT / "models").glob("*.py"))
    assert len(files) >= 4
    leaks = [f"{path.name} imports {module}" for path in files for module in _imported_modules(path)
             if module.split(".")[0] in ("data_prep", "pipeline")]
    assert leaks == []


def test_the_ignore_index_is_written_once():
    """-100 appears only where models/ defines IGNORE_INDEX, which is F.cross_entropy's default ignore_index."""
    assert IGNORE_INDEX == inspect.signature(F.cross_entropy).parameters["ignore_index"].default
    literals = []
    for folder in ("models", "data_prep", "pipeline", "benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
            literals += [str(path.relative_to(ROOT)) for a, b in zip(tokens, tokens[1:])
                         if a.string == "-" and b.type == tokenize.NUMBER and b.string == "100"]
    assert literals == ["models/__init__.py"]
