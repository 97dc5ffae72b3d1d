"""`python -m pipeline +experiment=bert_tiny` end to end, shrunk to seconds, as a user runs it."""
from __future__ import annotations

import csv
import json

from tests.pipeline_cli import run_pipeline_cli


def test_bert_tiny_end_to_end(tmp_path):
    # no W&B key, login or cached credentials (pipeline_env): the run must still not block
    result = run_pipeline_cli(tmp_path, [])
    run_dir = tmp_path / "run"  # hydra.run.dir of pipeline_cli.tiny_overrides
    for stage in ("prepare", "bert_tokenizer", "bert_examples", "bert_pretrain", "word2vec", "finetune", "report"):
        assert (run_dir / stage / "stage.json").is_file(), stage
    with open(run_dir / "report" / "results.csv") as f:
        models = [row["model"] for row in csv.DictReader(f)]
    assert models == ["bert", "bert_random", "majority_class", "bow_logreg", "w2v_mean"]
    assert f"results: {run_dir / 'report' / 'results.md'}" in result.stdout
    # W&B ran offline: one run directory per training stage, ready for `wandb sync`.
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 7  # one per stage
    lineage = [json.loads(line) for line in (run_dir / "wandb_lineage.jsonl").read_text().splitlines()]
    examples = next(edge for edge in lineage if edge["stage"] == "bert_examples")
    assert [name.split(":")[0] for name in examples["uses"]] == ["bert_tokenizer", "prepare"]  # stage:hash, sorted
