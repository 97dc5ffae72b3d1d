"""`python -m pipeline +experiment=bert_tiny` end to end, shrunk to seconds, as a user runs it."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

from tests.conftest import TINY_OVERRIDES, write_books, write_sentiment_task


def test_bert_tiny_end_to_end(tmp_path):
    corpus, task = write_books(tmp_path / "books"), write_sentiment_task(tmp_path / "task")
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": "", "RAY_AUTH_MODE": "disabled",
           "HOME": str(tmp_path / "home")}  # no key, no login, no cached credentials: must still not block
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "+experiment=bert_tiny", f"data.corpus_dir={corpus}",
         f"finetune.data_dir={task}", f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}",
         *TINY_OVERRIDES],
        capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for stage in ("prepare", "tokenizer", "examples", "pretrain", "finetune", "report"):
        assert (run_dir / stage / "stage.json").is_file(), stage
    with open(run_dir / "report" / "results.csv") as f:
        models = [row["model"] for row in csv.DictReader(f)]
    assert models == ["pretrained", "random_init", "majority_class"]
    assert f"results: {run_dir / 'report' / 'results.md'}" in result.stdout
    # W&B ran offline: one run directory per training stage, ready for `wandb sync`.
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 6  # one per stage
    lineage = [json.loads(line) for line in (run_dir / "wandb_lineage.jsonl").read_text().splitlines()]
    examples = next(edge for edge in lineage if edge["stage"] == "examples")
    assert [name.split("-")[0] for name in examples["uses"]] == ["prepare", "tokenizer"]
