"""Offline W&B runs keep their artifact inputs in the run directory, and `pipeline.sync` declares them later."""
from __future__ import annotations

import json

from pipeline.engine.tracking import LINEAGE_FILE
from pipeline.sync import lineage_edges, replay_lineage


class FakeRun:
    def __init__(self, path, log):
        self.path, self.log = path, log

    def use_artifact(self, artifact):
        self.log.append((self.path, artifact))


class FakeApi:
    def __init__(self):
        self.log = []

    def run(self, path):
        return FakeRun(path, self.log)

    def artifact(self, name):
        return name


def test_recorded_edges_are_replayed_through_the_public_api(tmp_path):
    (tmp_path / LINEAGE_FILE).write_text(
        json.dumps({"run_id": "r1", "stage": "prepare", "uses": []}) + "\n"
        + json.dumps({"run_id": "r2", "stage": "bert_examples", "uses": ["prepare:aa", "bert_tokenizer:bb"]}) + "\n"
        # written before stage outputs were versions of one artifact per stage
        + json.dumps({"run_id": "r3", "stage": "bert_examples", "uses": ["prepare-aa"]}) + "\n")
    api = FakeApi()
    assert replay_lineage(lineage_edges(tmp_path), api, "me", "textrep") == 3
    assert api.log == [("me/textrep/r2", "me/textrep/prepare:aa"), ("me/textrep/r2", "me/textrep/bert_tokenizer:bb"),
                       ("me/textrep/r3", "me/textrep/prepare-aa:latest")]
