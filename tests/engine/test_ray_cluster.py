"""`ray.address=HOST:PORT` runs the stages on an existing Ray cluster (here a head started on loopback) instead of
starting a private Ray instance."""
from __future__ import annotations

import re

import pytest

from tests.pipeline_cli import ray_cluster, run_pipeline_cli, stage_executions


@pytest.mark.slow
def test_the_pipeline_joins_a_running_cluster(tmp_path):
    with ray_cluster(tmp_path) as (port, temp_dir):
        result = run_pipeline_cli(tmp_path, ["pipeline.until=bert_examples", f"ray.address=127.0.0.1:{port}"],
                                  RAY_ADDRESS="")
        driver_log = result.stdout + result.stderr
        # Ray reports the head by the node's address, which need not be the loopback one we gave.
        connected = re.search(rf"Connecting to existing Ray cluster at address: \S+:{port}\b", driver_log)
        assert connected, driver_log[-3000:]
        assert "Connected to Ray cluster." in driver_log and "Started a local Ray instance" not in driver_log
        for stage in ("prepare", "bert_tokenizer", "bert_examples"):
            assert (tmp_path / "run" / stage / "_COMPLETE.json").is_file(), stage
            assert stage_executions(tmp_path / "cache", stage) == 1, stage
        assert not (tmp_path / "run" / "bert_pretrain").exists()
        # The stages ran in the cluster's workers: their output is in that cluster's worker logs.
        worker_logs = "".join(p.read_text(errors="replace")
                              for p in (temp_dir / "session_latest" / "logs").glob("worker-*.out"))
        assert "stage prepare: running" in worker_logs and "stage bert_examples: running" in worker_logs
