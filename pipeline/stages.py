"""The stage graph of every run: the corpus stage, each family's stages (pipeline/families.py), then the downstream
stages that read whichever families a run asks for. Each stage writes into its own content-addressed directory
(pipeline/engine/dag.py), linked from the run directory as `<run_dir>/<stage>`."""
from __future__ import annotations

from pipeline.corpus import PREPARE
from pipeline.downstream.finetune import FINETUNE
from pipeline.downstream.word2vec import WORD2VEC
from pipeline.engine.dag import Stage
from pipeline.evaluation.stage import EVALUATE
from pipeline.families import FAMILIES
from pipeline.report.stage import REPORT

STAGES: dict[str, Stage] = {s.name: s for s in [
    PREPARE, *(stage for family in FAMILIES for stage in family.stages), WORD2VEC, FINETUNE, EVALUATE, REPORT]}
