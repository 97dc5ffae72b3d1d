"""A family is one folder plus one registry line: the stage graph, `evaluate`, `finetune`, `report`, `export`,
`generate` and the tests' tiny runs pick up a new family from pipeline/families.py alone, and the generic code names no
family."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline import CONF_DIR
from pipeline.families import FAMILIES

REPO = CONF_DIR.parent
GENERIC = ["pipeline/engine", "pipeline/downstream/finetune.py", "pipeline/evaluation/stage.py", "pipeline/report",
           "pipeline/stages.py", "pipeline/runner.py", "pipeline/corpus.py", "pipeline/export.py",
           "pipeline/generate.py", "tests/helpers.py"]

# Runs in a fresh interpreter (argv[1]: a directory to work in): the generic modules read the registry when they are
# first imported, so the family is added to it first, as its one line in pipeline/families.py would.
TOY_FAMILY = """
import contextlib, io, json, sys
from pathlib import Path

import pipeline.families
from tests.run.toy_family.family import FAMILY as TOY, VALIDATED
pipeline.families.FAMILIES = (*pipeline.families.FAMILIES, TOY)

from omegaconf import OmegaConf
from pipeline.engine.dag import run_dag
from pipeline.export import export
from pipeline.generate import main as generate
from pipeline.runner import validate
from pipeline.stages import STAGES
from tests.helpers import family_config, start_session_ray

tmp = Path(sys.argv[1])
start_session_ray()  # prepare's shard tasks run on Ray
cfg = family_config(tmp, "toy", ["pipeline.stages=[toy_pretrain,finetune,evaluate,report]", "finetune.models=[toy]",
                                 "evaluate.encoders=[toy_bow,glove_bow]", "finetune.baselines=[majority_class]"])
validate(cfg)
offered = {name: list(STAGES[name].upstream(cfg)) for name in ("finetune", "evaluate", "report")}
cfg.pipeline.stages = ["toy_pretrain"]  # whose encoder and fine-tune kind are never built
run_dir = Path(cfg.paths.run_dir)  # what python -m pipeline leaves there: the engine's, then Hydra's config
results = run_dag(cfg, STAGES, run_dir)
(run_dir / ".hydra").mkdir()
OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
(exported,) = export(run_dir, tmp / "exported")
(tmp / "inputs.txt").write_text("abc\\nhello world\\n")
with contextlib.redirect_stdout(io.StringIO()) as out:
    status = generate([str(run_dir), "--input", str(tmp / "inputs.txt")])
print(json.dumps({"stages": list(STAGES), "validated": VALIDATED, **offered, "ran": list(results),
                  "exported": exported.name, "card": (exported / "README.md").read_text(),
                  "generate": [status, out.getvalue()]}))
"""


def test_a_new_family_is_one_folder_and_one_registry_line(tmp_path):
    """tests/run/toy_family/ and one line adding it to the registry: the stage graph, the start-up checks,
    `finetune`, `evaluate` and `report` offer it, and a run of it is exported and generates text."""
    out = subprocess.run([sys.executable, "-c", TOY_FAMILY, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["stages"][-4:] == ["word2vec", "finetune", "evaluate", "report"] and "toy_pretrain" in seen["stages"]
    assert seen["finetune"] == ["toy_pretrain"]
    assert seen["evaluate"] == ["toy_pretrain"]  # glove_bow reads no stage
    # and the corpus the family pretrained on: what prepare kept and removed as overlapping the evaluation text
    assert seen["report"] == ["toy_pretrain", "finetune", "evaluate", "prepare"]
    # the family's own start-up checks run before any stage, told which stages the run has (with their ancestors)
    assert len(seen["validated"]) == 1 and {"toy_pretrain", "prepare"} <= set(seen["validated"][0])
    assert seen["ran"] == ["prepare", "toy_pretrain"]
    assert seen["exported"] == "toy" and "A toy model of width 4." in seen["card"]
    assert seen["generate"] == [0, "cba\ndlrow olleh\n"]


def test_every_registered_family_offers_its_stages_and_a_random_twin_per_encoder():
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    for family in FAMILIES:
        stage_names = {s.name for s in family.stages}
        assert set(family.pretraining_stages) <= stage_names, family.name
        trained = [e for e in family.encoders if not e.endswith("_random") and e + "_random" in family.encoders]
        assert trained, f"{family.name} offers no pretrained encoder with a random twin to evaluate"
        # each exports its final models and has a tiny run for the tests; a model that writes text is pretrained
        assert family.describe_export and family.tiny and family.tiny.data_stages[0] == "prepare", family.name
        assert family.generation is None or family.generation.stage in family.pretraining_stages, family.name


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_generic_code_imports_no_family():
    families = {f"pipeline.{family.name}" for family in FAMILIES}
    files = [p for g in GENERIC for p in ((REPO / g).rglob("*.py") if (REPO / g).is_dir() else [REPO / g])]
    assert len(files) > 10
    for path in files:
        leaks = {m for m in _imported_names(path) if any(m == f or m.startswith(f + ".") for f in families)}
        assert not leaks, f"{path.relative_to(REPO)} imports {sorted(leaks)}: go through pipeline/families.py"
