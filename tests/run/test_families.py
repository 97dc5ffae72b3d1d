"""A family is one folder plus one registry line: the stage graph, `evaluate`, `finetune` and `report` pick up a new
family from pipeline/families.py alone, and the generic code names no family."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from pipeline import CONF_DIR
from pipeline.families import FAMILIES

REPO = CONF_DIR.parent
GENERIC = ["pipeline/engine", "pipeline/downstream/finetune.py", "pipeline/evaluation/stage.py", "pipeline/report",
           "pipeline/stages.py", "pipeline/runner.py", "pipeline/corpus.py"]

# Runs in a fresh interpreter: the registry is read when the generic modules are first imported.
TOY_FAMILY = """
import json, sys, types
from hydra import compose, initialize_config_dir
from pipeline import CONF_DIR
from pipeline.engine.dag import Stage
from pipeline.engine.family import EncoderSpec, Family, FinetuneKind
from pipeline.bert.family import FAMILY as BERT

validated = []
toy = Family("toy", stages=(Stage("toy_pretrain", lambda ctx: {}, ("prepare",), ("seed",)),),
             pretraining_stages=("toy_pretrain",),
             encoders={"toy_bow": EncoderSpec(lambda cfg: ("toy_pretrain",), lambda ctx: None)},
             finetune_kinds={"toy": FinetuneKind(lambda cfg: ("toy_pretrain",), lambda ctx: None)},
             validate=lambda cfg, stages: validated.append(stages))
registry = types.ModuleType("pipeline.families")
registry.FAMILIES = (BERT, toy)
sys.modules["pipeline.families"] = registry

from pipeline.runner import validate
from pipeline.stages import STAGES
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = compose(config_name="config", overrides=[
        "pipeline.stages=[toy_pretrain,finetune,evaluate,report]", "finetune.models=[toy]",
        "evaluate.encoders=[toy_bow,glove_bow]", "finetune.baselines=[majority_class]"])
validate(cfg)
print(json.dumps({"stages": list(STAGES), "validated": validated,
                  **{name: list(STAGES[name].upstream(cfg)) for name in ("finetune", "evaluate", "report")}}))
"""


def test_a_new_family_is_picked_up_from_the_registry_alone():
    out = subprocess.run([sys.executable, "-c", TOY_FAMILY], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "toy_pretrain" in seen["stages"] and "elmo_pretrain" not in seen["stages"]
    assert seen["finetune"] == ["toy_pretrain"]
    assert seen["evaluate"] == ["toy_pretrain"]  # glove_bow reads no stage
    # and the corpus the family pretrained on: what prepare kept and removed as overlapping the evaluation text
    assert seen["report"] == ["toy_pretrain", "finetune", "evaluate", "prepare"]
    # the family's own start-up checks run before any stage, told which stages the run has (with their ancestors)
    assert len(seen["validated"]) == 1 and {"toy_pretrain", "prepare"} <= set(seen["validated"][0])


def test_every_registered_family_offers_its_stages_and_a_random_twin_per_encoder():
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    for family in FAMILIES:
        stage_names = {s.name for s in family.stages}
        assert set(family.pretraining_stages) <= stage_names, family.name
        trained = [e for e in family.encoders if not e.endswith("_random") and e + "_random" in family.encoders]
        assert trained, f"{family.name} offers no pretrained encoder with a random twin to evaluate"


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
