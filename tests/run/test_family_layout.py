"""Every family has one layout (docs/architecture.md, "A family's folder"): the same seven files with the same jobs in
pipeline/<family>/, and its HuggingFace conversion in models/hf/<family>.py. A reader who knows one family finds
another's PretrainingTask, schemas and validation in the same place."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline.engine.pretraining import pretrain
from pipeline.families import FAMILIES
from tests.run.test_import_graph import ROOT, imports_of, project_modules

LAYOUT = ("family.py", "settings.py", "data_stages.py", "pretrain.py", "module.py", "encoder.py", "downstream.py")
HEAVY = ("torch", "lightning", "transformers")
# the names of HuggingFace conversions: to_hf, from_hf, from_hf_pretraining, config_from_hf, continue_from_hf
HF_CONVERSION = re.compile(r"(^|_)(to|from)_hf(_|$)")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_family_folder_has_the_layout_files(family):
    folder = ROOT / "pipeline" / family.name
    assert [name for name in LAYOUT if not (folder / name).is_file()] == []
    # the stage list is pretrain.py's, after the task whose stages it lists: no stages.py of its own
    assert not (folder / "stages.py").exists()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_job_is_in_its_file(family):
    package = f"pipeline.{family.name}"
    assert {schema.__module__ for schema in family.config.values()} <= {f"{package}.settings"}
    assert family.validate.__module__ in ("pipeline.engine.family", f"{package}.family")  # the default: no checks
    for stage in family.stages:
        if stage.name in family.pretraining_stages:
            assert stage.fn.func is pretrain
            assert type(stage.fn.keywords["task"]).__module__ == f"{package}.pretrain", stage.name
        else:
            fn = getattr(stage.fn, "func", stage.fn)
            assert fn.__module__ == f"{package}.data_stages", stage.name


def _heavy_imports(module: str, modules: dict[str, Path]) -> list[list[str]]:
    """The chains of project imports from `module` to a module of HEAVY, following every import (lazy ones too)."""
    chains, seen, todo = [], {module}, [[module]]
    while todo:
        chain = todo.pop()
        path = modules[chain[-1]]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            chains += [[*chain, name] for name in names if name.split(".")[0] in HEAVY]
        for imported in sorted(imports_of(chain[-1], path, modules) - seen):
            seen.add(imported)
            todo.append([*chain, imported])
    return chains


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_settings_import_no_torch(family):
    """A family's data stages read its settings in Ray workers that must stay without torch
    (tests/run/test_layering.py), and pipeline/config.py composes them before any model is built."""
    assert _heavy_imports(f"pipeline.{family.name}.settings", project_modules()) == []


def _functions(path: Path) -> list[str]:
    return [node.name for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.FunctionDef)]


def test_hf_conversion_lives_in_models_hf():
    for family in FAMILIES:
        assert "to_hf" in _functions(ROOT / "models" / "hf" / f"{family.name}.py"), family.name
    elsewhere = [f"{path.relative_to(ROOT)}: {name}" for path in sorted((ROOT / "models").rglob("*.py"))
                 if path.parent.name != "hf" for name in _functions(path) if HF_CONVERSION.search(name)]
    assert elsewhere == []
