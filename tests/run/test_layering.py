"""The layers stay apart: models/ imports neither data_prep/ nor pipeline/, data_prep/ knows no model (it imports
neither models/ nor pipeline/), and what both need is in conventions/, which imports none of them; the constants they
share are defined once."""
from __future__ import annotations

import ast
import functools
import inspect
import io
import json
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import torch.nn.functional as F

from models import IGNORE_INDEX

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.append(node.module)
    return modules


def _imports_of(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert len(files) >= 2
    return [f"{path.relative_to(ROOT)} imports {module}" for path in files for module in _imported_modules(path)
            if module.split(".")[0] in forbidden]


def test_models_import_neither_data_prep_nor_pipeline():
    assert _imports_of("models", ("data_prep", "pipeline")) == []


def test_data_functions_know_no_model():
    """data_prep/tasks/conll.py took IGNORE_INDEX from models/ once, and data_prep/examples/elmo_examples.py ELMo's
    word split."""
    assert _imports_of("data_prep", ("models", "pipeline")) == []


def test_data_prep_shows_its_three_jobs():
    """data_prep/ was 19 flat files: corpus preparation, each family's example builders and the task readers, told
    apart by name only. A module lands in one of the three folders."""
    assert sorted(p.name for p in (ROOT / "data_prep").iterdir() if p.suffix == ".py" or
                  (p.is_dir() and p.name != "__pycache__")) == ["__init__.py", "corpus", "examples", "tasks"]


def test_conventions_import_none_of_the_layers_nor_torch():
    assert _imports_of("conventions", ("models", "data_prep", "pipeline")) == []
    assert _modules_loaded_by("import conventions, conventions.elmo_words") == []


def test_the_ignore_index_is_written_once():
    """-100 appears only where conventions/ defines IGNORE_INDEX, which is F.cross_entropy's default ignore_index."""
    assert IGNORE_INDEX == inspect.signature(F.cross_entropy).parameters["ignore_index"].default
    literals = []
    for folder in ("conventions", "models", "data_prep", "pipeline", "benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
            literals += [str(path.relative_to(ROOT)) for a, b in zip(tokens, tokens[1:])
                         if a.string == "-" and b.type == tokenize.NUMBER and b.string == "100"]
    assert literals == ["conventions/__init__.py"]


# The stages before pretraining (prepare, and every family's stages but its pretraining ones), and the per-shard
# functions they map with Ray. Their workers must not load torch (~200 MB) or Lightning (~400 MB with it): at 66 MB of
# books, 2-4 such workers made up 2.3 GB of the data stages' 4.0 GB peak (docs/scaling.md).
_HEAVY = "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"


def _modules_loaded_by(code: str, tmp_path: Path | None = None) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(tmp_path or "")]))}
    out = subprocess.run([sys.executable, "-c", f"import sys\n{code}\n{_HEAVY}"], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return ast.literal_eval(out.strip().splitlines()[-1])


def test_data_stages_and_their_shard_tasks_do_not_load_torch():
    from pipeline.families import FAMILIES
    from pipeline.stages import STAGES

    def function(fn):
        return fn.func if isinstance(fn, functools.partial) else fn

    data_stages = [STAGES["prepare"], *(stage for family in FAMILIES for stage in family.stages
                                        if stage.name not in family.pretraining_stages)]
    assert len(data_stages) == 16
    modules = sorted({function(stage.fn).__module__ for stage in data_stages})
    assert len(modules) == 6  # pipeline.corpus and each family's data_stages
    imports = "\n".join(f"import {module}" for module in modules)
    assert _modules_loaded_by(imports) == []


def test_the_stage_runner_loads_torch_only_when_the_stage_does(tmp_path):
    # What a Ray worker runs for a stage (run_dag sends the stage's function alone): the runner, tracking (logger
    # Lightning's CSVLogger, told by name) and a torch-free stage function leave torch unloaded.
    (tmp_path / "torch_free_stage.py").write_text("def stage(ctx):\n    return {'rows': 3}\n")
    (tmp_path / "torch_stage.py").write_text(
        "def stage(ctx):\n    import torch\n    return {'threads': torch.get_num_threads()}\n")
    run = ("from omegaconf import OmegaConf\nfrom pathlib import Path\n"
           "from pipeline.engine.dag import execute_stage_with_threads\nimport {module}\n"
           "cfg = OmegaConf.create({{'logger': {{'_target_': 'lightning.pytorch.loggers.CSVLogger'}}}})\n"
           f"out = Path({str(tmp_path)!r}) / '{{module}}'\n"
           "print(execute_stage_with_threads(2, {module}.stage, cfg, 'stage', 'abc', out / 'abc', {{}}, None))")
    assert _modules_loaded_by(run.format(module="torch_free_stage"), tmp_path) == []
    assert _modules_loaded_by(run.format(module="torch_stage"), tmp_path) == ["torch"]
    assert json.loads((tmp_path / "torch_stage" / "abc" / "stage.json").read_text())["threads"] == 2
