"""benchmarks/prompt_probe.py: its median-threshold scoring and best-pair choice on a hand-made table, the selection
split it reads being the pipeline's, the template encoding, and one run end to end on a tiny model."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file

from data_prep.corpus.tokenizer import CLS_ID, MASK_ID, SEP_ID, train_wordpiece
from models.bert import BertForPreTraining, bert_config, save_pretrained
from pipeline import CONF_DIR
from pipeline.bert.data import prompt_ids
from pipeline.bert.pretrain import HEADS_FILE
from pipeline.config import Config
from pipeline.downstream.task_data import tsv_splits
from pipeline.downstream.tasks import load_task
from tests.helpers import NEGATIVE, OBJECTS, POSITIVE, SUBJECTS, write_sentiment_task

REPO = CONF_DIR.parent


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import prompt_probe

    return prompt_probe


def test_median_threshold_accuracy_and_best_pair_on_a_hand_made_table(probe):
    labels = [1, 1, 1, 0, 0, 0]
    log_probs = np.array([[0, -3, -3], [0, -2, -2], [0, -1, 2], [0, 1, 2], [0, 2, 0], [0, 3, 0]], dtype=float)
    accuracies = probe.pair_accuracies(log_probs, labels, ["good", "bad", "meh"])
    # good - bad = 3, 2, 1, -1, -2, -3: above its median (0) exactly on the positives; reversed, exactly on the
    # negatives. Only those above the median are called positive, ties included: good - meh = 3, 2, -2, -2, 0, 0
    # (median 0) calls sentences 0, 1 positive, 0, 1, 3, 4, 5 right; bad - meh = 0, 0, -3, -1, 2, 3 calls 4, 5
    # positive, only 3 right, and meh - bad calls 2, 3 positive, 2, 4, 5 right.
    assert accuracies == pytest.approx({("good", "bad"): 1.0, ("bad", "good"): 0.0, ("good", "meh"): 5 / 6,
                                        ("meh", "good"): 3 / 6, ("bad", "meh"): 1 / 6, ("meh", "bad"): 3 / 6})
    assert probe.best_pair(accuracies) == (("good", "bad"), 1.0)
    # flipped labels: the same pair the other way round
    flipped = probe.pair_accuracies(log_probs, [1 - y for y in labels], ["good", "bad", "meh"])
    assert probe.best_pair(flipped) == (("bad", "good"), 1.0)
    # a score unrelated to the labels calls half of each class positive: 0.5 on an unbalanced split too
    assert probe.median_accuracy(np.array([4.0, 3, 2, 1, 0, -1, -2, -3]), np.array([1, 1, 1, 0, 1, 1, 1, 0])) == 0.5


def test_the_selection_split_is_the_one_finetune_scores_on(probe, tmp_path):
    task_dir = write_sentiment_task(tmp_path / "rt", n_train=200)
    for seed in (1, 12345):
        _, pipeline_split, _ = tsv_splits(load_task("rotten_tomatoes"), task_dir, None, seed, 0.1)
        ours = probe.selection_split(task_dir, seed)
        assert (ours.texts_a, ours.labels) == (pipeline_split.texts_a, pipeline_split.labels)
        assert len(ours.labels) == 20
    (task_dir / "dev.tsv").unlink()  # it never reads dev.tsv
    assert probe.selection_split(task_dir, 12345).labels == pipeline_split.labels
    # the default seed is the run's: finetune passes the run's top-level `seed` (12345) to the split
    assert probe.parse_args(["--pretrain", "p", "--tokenizer", "t", "--task-dir", "d"]).seed == \
        OmegaConf.structured(Config).seed


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    sentences = [f"{s} found {o} {w} it was a film ." for s in SUBJECTS for o in OBJECTS for w in POSITIVE + NEGATIVE]
    return train_wordpiece(sentences, tmp_path_factory.mktemp("tok"), vocab_size=300, min_frequency=1)


def test_templates_keep_their_mask_when_the_sentence_is_cut(probe, tokenizer):
    sentences = ["the captain found the ship good", " ".join(["the old man found the river"] * 20)]
    for template in probe.TEMPLATES:
        short, long = prompt_ids(tokenizer, template, sentences, max_seq_length=24)
        for ids in (short, long):
            assert ids[0] == CLS_ID and ids[-1] == SEP_ID and ids.count(MASK_ID) == 1
        assert len(long) == 24 and len(short) < 24
        # the template's own pieces are the same in both: only the sentence was cut
        template_pieces = len(short) - 2 - len(tokenizer.encode(sentences[0], add_special_tokens=False).ids)
        if template.startswith("{text}"):
            assert long[-template_pieces - 1:] == short[-template_pieces - 1:]
        else:
            assert long[:template_pieces + 1] == short[:template_pieces + 1]
    with pytest.raises(ValueError, match="once each"):
        prompt_ids(tokenizer, "{text} it was good .", sentences, max_seq_length=24)


def test_label_words_drop_words_of_several_pieces(probe, tokenizer):
    kept, dropped = probe.label_words(tokenizer, ("good", "bad", "unforgettable"))
    assert list(kept) == ["good", "bad"] and dropped == ["unforgettable"]
    assert kept["good"] == tokenizer.token_to_id("good")


def test_one_run_on_a_tiny_pretrain_stage(probe, tokenizer, tmp_path, capsys):
    torch.manual_seed(0)
    model = BertForPreTraining(bert_config("bert_tiny", vocab_size=tokenizer.get_vocab_size(), hidden_size=32,
                                           num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                           max_position_embeddings=64)).eval()
    stage = tmp_path / "bert_pretrain"
    save_pretrained(model.bert, stage / "encoder")
    save_file(model.heads_state_dict(), str(stage / HEADS_FILE))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    task_dir = write_sentiment_task(tmp_path / "rt", n_train=200)

    loaded = probe.load_pretraining_model(stage)
    sequences = prompt_ids(tokenizer, probe.TEMPLATES[0], probe.selection_split(task_dir, 1).texts_a, probe.MAX_LENGTH)
    words = [tokenizer.token_to_id(w) for w in ("good", "bad")]
    # the stage's heads as written, and padding in a batch changes no sentence's scores
    one_by_one = probe.mask_log_probs(model, sequences, words, batch_size=1)
    np.testing.assert_allclose(probe.mask_log_probs(loaded, sequences, words, batch_size=8), one_by_one, atol=1e-5)

    summary = probe.main(["--pretrain", str(stage), "--tokenizer", str(tmp_path), "--task-dir", str(task_dir),
                          "--seed", "1"])
    out = capsys.readouterr().out
    assert "| encoder | template | best ordered pair | its accuracy | good vs bad |" in out
    assert json.loads(out.strip().splitlines()[-1]) == json.loads(json.dumps(summary))
    assert summary["sentences"] == 20 and "hate" in summary["dropped"]  # not in the tokenizer's sentences
    assert summary["label_words"] + summary["dropped"] == [w for w in probe.CANDIDATES if w in summary["label_words"]] \
        + [w for w in probe.CANDIDATES if w in summary["dropped"]]
    assert set(summary["label_words"]) | set(summary["dropped"]) == set(probe.CANDIDATES)
    assert summary["chance_std"] == pytest.approx(0.5 / np.sqrt(20), abs=1e-4)
    results = summary["results"]
    assert set(results) == {"pretrained", "random init"} and set(results["pretrained"]) == set(probe.TEMPLATES)
    # the twin is another model: its scores differ
    assert results["pretrained"] != results["random init"]
    for by_template in results.values():
        for r in by_template.values():
            k = len(summary["label_words"])
            assert len(r["pair_accuracy"]) == k and r["best_accuracy"] == max(
                a for row in r["pair_accuracy"] for a in row if a is not None)
