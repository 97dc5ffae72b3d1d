"""SentEval-style evaluation: readers, the logistic-regression protocol, encoders, run_senteval (the metrics are
pipeline/evaluation/metrics.py's, tested in test_metrics.py)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from data_prep.corpus.tokenizer import train_wordpiece
from data_prep.corpus.word_vectors import WordVectors
from data_prep.tasks.senteval_data import (
    read_cr,
    read_labelled_tsv,
    read_mpqa,
    read_mr,
    read_mrpc,
    read_sick,
    read_subj,
    read_trec,
    tokenize,
)
from models.bert import BertConfig, BertModel, save_pretrained
from pipeline.bert.encoder import BertEncoder
from pipeline.engine.family import Encoder
from pipeline.evaluation.classifier_settings import ClassifierConfig, ClassifierSettings
from pipeline.evaluation.embedding import GloveBagOfWords, embed
from pipeline.evaluation.model_selection import Examples, cross_validated_accuracy, fit_selecting_l2, stratified_folds
from pipeline.evaluation.pair_features import pair_features
from pipeline.evaluation.relatedness import expected_relatedness, relatedness_regression, relatedness_targets
from pipeline.evaluation.senteval import SentevalConfig, results_table, run_senteval
from pipeline.evaluation.softmax_regression import fit_softmax_regressions
from pipeline.evaluation.task_kinds import TASK_KINDS, evaluate_train_test
from tests.helpers import NEGATIVE, OBJECTS, POSITIVE, SUBJECTS, VERBS, write_sentiment_task

SICK_HEADER = ("pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tentailment_AB\tentailment_BA\t"
               "sentence_A_original\tsentence_B_original\tsentence_A_dataset\tsentence_B_dataset\tSemEval_set")


# -----------------------------------------------------------------------------
# Classifier protocol on synthetic features


def test_separable_task_cross_validates_above_95_percent_and_random_labels_stay_near_chance():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(400, 10)).astype(np.float32)
    separable = (features @ rng.normal(size=10) > 0).astype(np.int64)
    random_labels = rng.permutation(np.repeat([0, 1], 200))  # balanced: chance is exactly 50 %
    settings = ClassifierSettings(l2_grid=(1e-4, 1e-2, 1.0))  # SentEval's 10 outer x 5 inner folds, a shorter grid

    assert cross_validated_accuracy(features, separable, 2, settings, np.random.default_rng(1)) > 0.95
    # Labels independent of the features: each held-out prediction is right with probability 1/2, so the accuracy
    # over 400 examples has standard deviation sqrt(0.25 / 400) = 0.025; 0.1 is four of them.
    chance = cross_validated_accuracy(features, random_labels, 2, settings, np.random.default_rng(1))
    assert abs(chance - 0.5) < 0.1


def test_cross_validation_is_deterministic_given_the_seed():
    rng = np.random.default_rng(3)
    features = rng.normal(size=(120, 6)).astype(np.float32)
    labels = (features[:, 0] + 0.8 * rng.normal(size=120) > 0).astype(np.int64)
    settings = ClassifierSettings(l2_grid=(1e-3, 1e-1), cv_folds=5, inner_folds=3)
    runs = [cross_validated_accuracy(features, labels, 2, settings, np.random.default_rng(7)) for _ in range(2)]
    assert runs[0] == runs[1]


def test_stratified_folds_partition_the_examples_and_balance_each_class():
    labels = np.array([0] * 30 + [1] * 10 + [2] * 5)
    folds = stratified_folds(labels, 5, np.random.default_rng(0))
    assert sorted(np.concatenate(folds).tolist()) == list(range(len(labels)))
    for fold in folds:
        assert np.bincount(labels[fold], minlength=3).tolist() == [6, 2, 1]
    again = stratified_folds(labels, 5, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(folds, again))
    with pytest.raises(ValueError, match="cannot be split into 10 folds"):
        stratified_folds(labels[:4], 10, np.random.default_rng(0))


def test_model_selection_keeps_the_l2_with_the_best_validation_score():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=60)
    examples = Examples(rng.normal(size=(60, 5)).astype(np.float32), np.eye(2)[labels], labels)
    settings = ClassifierSettings(l2_grid=(1e-4, 1.0, 100.0))
    # Stronger L2 -> smaller weights -> predictions closer to uniform: a score rewarding confidence must pick the
    # weakest value, one rewarding uncertainty the strongest.
    confidence = lambda probabilities, truth: float(probabilities.max(1).mean())  # noqa: E731
    uncertainty = lambda probabilities, truth: -confidence(probabilities, truth)  # noqa: E731
    assert fit_selecting_l2(examples, [(np.arange(60), examples)], confidence, settings)[1] == 1e-4
    assert fit_selecting_l2(examples, [(np.arange(60), examples)], uncertainty, settings)[1] == 100.0


def test_fitting_problems_together_gives_each_the_model_it_gets_alone():
    rng = np.random.default_rng(5)
    # Offset, unevenly scaled features: each problem must standardise with its own rows' statistics.
    features = (rng.normal(size=(90, 4)) * [1.0, 10.0, 0.1, 3.0] + [50.0, -3.0, 0.0, 7.0]).astype(np.float32)
    labels = rng.integers(0, 3, size=90)
    targets = np.eye(3, dtype=np.float32)[labels]
    problems = [(np.arange(0, 60), 1e-2), (np.arange(30, 90), 1.0), (rng.permutation(90)[:45], 1e-1)]
    together = fit_softmax_regressions(features, targets, problems, max_iter=500)
    for (rows, l2), model in zip(problems, together):
        alone = fit_softmax_regressions(features[rows], targets[rows], [(np.arange(len(rows)), l2)], 500)[0]
        # L-BFGS in float32 stops a little apart on the two batch shapes: 2.01e-4 on the AMX Xeon, against the 1e-2
        # that separates two problems below
        np.testing.assert_allclose(model.predict_proba(features), alone.predict_proba(features), atol=5e-4)
        np.testing.assert_allclose(model.mean.numpy(), features[rows].mean(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(model.scale.numpy(), features[rows].std(0, ddof=1), rtol=1e-4)
    # Different rows and strengths give different models: no problem sees another's rows.
    assert not np.allclose(together[0].predict_proba(features), together[1].predict_proba(features), atol=1e-2)


def test_pair_features_are_sentevals_by_default_and_infersents_on_request():
    u, v = np.array([[1.0, 2.0]]), np.array([[3.0, -1.0]])
    assert pair_features(u, v).tolist() == [[2.0, 3.0, 3.0, -2.0]]  # [|u - v|, u * v]
    assert pair_features(u, v, ("u", "v", "abs_diff", "product")).tolist() == \
        [[1.0, 2.0, 3.0, -1.0, 2.0, 3.0, 3.0, -2.0]]
    assert pair_features(np.ones((5, 7)), np.zeros((5, 7))).shape == (5, 14)
    cfg = OmegaConf.structured(SentevalConfig)
    assert ClassifierSettings.from_config(cfg.classifier, cfg.pair_features).pair_features == ("abs_diff", "product")
    for bad in ([], ["abs_diff", "sum"]):
        with pytest.raises(ValueError, match=r"senteval.pair_features=.*: give a non-empty list of \['u', 'v', "):
            ClassifierSettings.from_config(cfg.classifier, bad)


# -----------------------------------------------------------------------------
# Relatedness (Tai et al. 2015)


def test_relatedness_targets_put_the_score_between_its_two_neighbouring_classes():
    targets = relatedness_targets(np.array([3.4, 5.0, 1.0]))
    np.testing.assert_allclose(targets, [[0, 0, 0.6, 0.4, 0], [0, 0, 0, 0, 1], [1, 0, 0, 0, 0]], atol=1e-6)
    scores = np.random.default_rng(0).uniform(1, 5, size=50)
    np.testing.assert_allclose(expected_relatedness(relatedness_targets(scores)), scores, atol=1e-5)
    with pytest.raises(ValueError, match=r"\[1, 5\]"):
        relatedness_targets(np.array([0.5, 3.0]))


def test_relatedness_regression_recovers_a_linear_relation():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(700, 8)).astype(np.float32)
    scores = np.clip(3 + features @ (0.4 * rng.normal(size=8)) + 0.1 * rng.normal(size=700), 1, 5)
    split = lambda a, b: (features[a:b], scores[a:b])  # noqa: E731
    metrics = relatedness_regression(split(0, 400), split(400, 500), split(500, 700), ClassifierSettings())
    assert metrics["pearson"] > 0.9
    assert metrics["spearman"] > 0.9


# -----------------------------------------------------------------------------
# Readers


def test_tokenize_lowercases_and_splits_punctuation_and_clitics():
    assert tokenize("Don't stop, it's 2.5 km!") == ["do", "n't", "stop", ",", "it", "'s", "2.5", "km", "!"]


def test_read_mr_decodes_latin1_and_utf8_files(tmp_path):
    (tmp_path / "rt-polarity.pos").write_bytes("a caf\xe9 worth the trip .\n\nFunny and warm\n".encode("latin-1"))
    (tmp_path / "rt-polarity.neg").write_text("a dull café\n", encoding="utf-8")
    mr = read_mr(tmp_path)
    assert mr.sentences == [["a", "dull", "café"], ["a", "café", "worth", "the", "trip", "."], ["funny", "and", "warm"]]
    assert mr.labels == [0, 1, 1]
    (tmp_path / "rt-polarity.neg").unlink()
    with pytest.raises(FileNotFoundError, match="rt-polarity.neg"):
        read_mr(tmp_path)


def test_one_sentence_per_line_readers_take_senteval_and_original_layouts(tmp_path):
    (tmp_path / "senteval").mkdir()
    (tmp_path / "senteval" / "subj.objective").write_text("the film follows a sailor\n")
    (tmp_path / "senteval" / "subj.subjective").write_text("a wonderful film\nsheer boredom\n")
    (tmp_path / "cornell").mkdir()
    (tmp_path / "cornell" / "plot.tok.gt9.5000").write_text("the film follows a sailor\n")
    (tmp_path / "cornell" / "quote.tok.gt9.5000").write_text("a wonderful film\nsheer boredom\n")
    for layout in ("senteval", "cornell"):
        subj = read_subj(tmp_path / layout)
        assert subj.labels == [0, 1, 1] and subj.label_names == ["objective", "subjective"]
        assert subj.sentences[1] == ["a", "wonderful", "film"]
    (tmp_path / "MPQA").mkdir()
    (tmp_path / "MPQA" / "mpqa.pos").write_text("supports\n")
    (tmp_path / "MPQA" / "mpqa.neg").write_text("complains bitterly\ndenied\n")
    assert read_mpqa(tmp_path / "MPQA").labels == [0, 0, 1]
    # what the evaluate stage's task kinds read (senteval.tasks.<name>.kind)
    assert TASK_KINDS["subj"][0](tmp_path / "cornell", {}) == subj
    assert TASK_KINDS["mpqa"][0](tmp_path / "MPQA", {}) == read_mpqa(tmp_path / "MPQA")
    # a missing file names every layout the task accepts
    with pytest.raises(FileNotFoundError, match=r"subj.objective, subj.subjective; or .*plot.tok.gt9.5000"):
        read_subj(tmp_path / "MPQA")
    (tmp_path / "MPQA" / "mpqa.neg").write_text("denied\nbitter complaint\t0\n")
    with pytest.raises(ValueError, match=r"mpqa.neg:2: a tab .* expected one sentence per line"):
        read_mpqa(tmp_path / "MPQA")


HU_LIU_PRODUCT = """\
*****************************************************************************
* Annotated by: Minqing Hu and Bing Liu, 2004.
* Product name: Canon G3
*****************************************************************************

[t]excellent camera
##i recently purchased the canon powershot g3 .
camera[+2]##the camera is very easy to use .
battery[-2][u]##battery life is short .
picture[+3],menu[-1]##great pictures but a clumsy menu .
[t] not worth it
size[+2][p], lens[+1]##small and sharp .
"""


def test_read_cr_takes_senteval_files_or_hu_liu_annotated_products(tmp_path):
    (tmp_path / "senteval").mkdir()
    (tmp_path / "senteval" / "custrev.pos").write_text("easy to use\n")
    (tmp_path / "senteval" / "custrev.neg").write_text("battery life is short\n")
    assert read_cr(tmp_path / "senteval").labels == [0, 1]

    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "Canon G3.txt").write_text(HU_LIU_PRODUCT)
    (tmp_path / "original" / "Readme.txt").write_text("Symbols used in the annotated reviews: [t] the title\n")
    cr = read_cr(tmp_path / "original")
    # untagged and mixed [+n]/[-n] sentences are dropped, [t] titles and the * header are not sentences
    assert cr.sentences == [["the", "camera", "is", "very", "easy", "to", "use", "."],
                            ["battery", "life", "is", "short", "."], ["small", "and", "sharp", "."]]
    assert cr.labels == [1, 0, 1]
    assert TASK_KINDS["cr"][0](tmp_path / "original", {}) == cr
    (tmp_path / "original" / "Canon G3.txt").write_text(HU_LIU_PRODUCT + "camera[+2] the camera is great\n")
    with pytest.raises(ValueError, match=r"Canon G3.txt:13: 'camera\[\+2\] the camera is great' is not a review "
                                         r"line; expected Hu & Liu's annotated review format"):
        read_cr(tmp_path / "original")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="custrev.neg and custrev.pos, or Hu & Liu's annotated product"):
        read_cr(tmp_path / "empty")


def test_read_cr_accepts_the_single_hash_lines_of_the_files_as_distributed_and_counts_them(tmp_path, capsys):
    """Issue 39, defect 7: a line of the Apex DVD player's file parts its tags and sentence with one '#', and the
    reader refused the whole task there."""
    (tmp_path / "Canon G3.txt").write_text(HU_LIU_PRODUCT)
    (tmp_path / "Apex AD2600 Progressive-scan DVD player.txt").write_text(
        "[t] works\nplayer[+2]#plays every disc i own .\nremote[-2]##the remote is flimsy .\n")
    cr = read_cr(tmp_path)
    assert (cr.sentences[:2], cr.labels[:2]) == ([["plays", "every", "disc", "i", "own", "."],
                                                  ["the", "remote", "is", "flimsy", "."]], [1, 0])
    assert len(cr.labels) == 5
    assert ("CR: 1 line(s) part tags and sentence with a single '#', a known quirk of Hu & Liu's files, read as '##': "
            "Apex AD2600 Progressive-scan DVD player.txt (1)") in capsys.readouterr().out


def test_read_trec_labels_questions_by_their_coarse_class_on_its_own_split(tmp_path):
    (tmp_path / "train_5500.label").write_bytes("NUM:date When did the war end ?\nHUM:ind Who wrote Hamlet ?\n"
                                                "LOC:city Where is Sant\xe9 ?\n".encode("latin-1"))
    (tmp_path / "TREC_10.label").write_text("DESC:manner How do bees fly ?\n")
    trec = read_trec(tmp_path)
    assert trec["train"].labels == [5, 3, 4] and trec["test"].labels == [1]
    assert trec["train"].label_names == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    assert trec["train"].sentences[2] == ["where", "is", "santé", "?"]
    (tmp_path / "TREC_10.label").write_text("DESC:manner How do bees fly ?\nHow do fish swim ?\n")
    with pytest.raises(ValueError, match=r"TREC_10.label:2: 'How do fish swim \?' is not a TREC question line; "
                                         r"expected 'COARSE:fine question'"):
        read_trec(tmp_path)
    (tmp_path / "TREC_10.label").unlink()
    with pytest.raises(FileNotFoundError, match="train_5500.label, TREC_10.label"):
        read_trec(tmp_path)


def _write_sick(path, rows):
    lines = [SICK_HEADER] + ["\t".join([str(i), a, b, label, score, "x", "x", a, b, "FLICKR", "FLICKR", split])
                             for i, (a, b, label, score, split) in enumerate(rows, 1)]
    path.write_text("\r\n".join(lines) + "\n")  # the release has DOS line ends except on its last line
    return path


def test_read_sick_splits_by_semeval_set_and_reports_malformed_lines(tmp_path):
    path = _write_sick(tmp_path / "SICK.txt", [
        ("A man is playing", "A man plays", "ENTAILMENT", "4.5", "TRAIN"),
        ("A dog runs", "Nobody runs", "CONTRADICTION", "2", "TRIAL"),
        ('The "quoted" cat', "A cat", "NEUTRAL", "3.1", "TEST"),
    ])
    sick = read_sick(path)
    assert {k: len(v.labels) for k, v in sick.items()} == {"train": 1, "dev": 1, "test": 1}
    assert sick["train"].sentences_a == [["a", "man", "is", "playing"]]
    assert sick["test"].sentences_a == [["the", '"', "quoted", '"', "cat"]]
    assert [sick[s].labels[0] for s in ("train", "dev", "test")] == [2, 0, 1]
    assert sick["test"].scores == [3.1]

    good = path.read_text()
    path.write_text(good.replace("4.5", "high"))
    with pytest.raises(ValueError, match=r"SICK.txt:2: relatedness_score 'high' is not a number"):
        read_sick(path)
    path.write_text(good + "4\tA cat\tA dog\tNEUTRAL\t3\tTRAIN\n")
    with pytest.raises(ValueError, match=r"SICK.txt:5: expected 12 tab-separated fields"):
        read_sick(path)
    path.write_text(good.replace("TRIAL", "DEV"))
    with pytest.raises(ValueError, match=r"SICK.txt:3: SemEval_set 'DEV'"):
        read_sick(path)


def test_read_mrpc_keeps_bare_quotes_and_names_bad_lines(tmp_path):
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    (tmp_path / "train.tsv").write_text(f'{header}\n1\t1\t2\tHe said " yes .\tHe agreed .\n0\t3\t4\tA\tB\n')
    (tmp_path / "dev.tsv").write_text(f"{header}\n1\t5\t6\tC\tD\n")
    mrpc = read_mrpc(tmp_path)
    assert mrpc["train"].sentences_a[0] == ["he", "said", '"', "yes", "."]
    assert mrpc["train"].labels == [1, 0] and mrpc["dev"].labels == [1]
    (tmp_path / "dev.tsv").write_text(f"{header}\n1\t5\t6\tC\tD\nyes\t7\t8\tE\tF\n")
    with pytest.raises(ValueError, match=r"dev.tsv:3: Quality 'yes'"):
        read_mrpc(tmp_path)


def test_read_labelled_tsv_maps_labels_and_rejects_unknown_ones(tmp_path):
    path = tmp_path / "task.tsv"
    path.write_text("id\tsentence\tlabel\n1\tGood film\tpos\n2\tBad film\tneg\n")
    task = read_labelled_tsv(path, "sentence", "label")
    assert task.label_names == ["neg", "pos"] and task.labels == [1, 0]
    with pytest.raises(ValueError, match=r"task.tsv:3: label 'neg' is not one of \['pos', 'neutral'\]"):
        read_labelled_tsv(path, "sentence", "label", ["pos", "neutral"])
    with pytest.raises(ValueError, match=r"task.tsv:1: header .* lacks column\(s\) \['text'\]"):
        read_labelled_tsv(path, "text", "label")


# -----------------------------------------------------------------------------
# Encoders


class LengthEncoder:
    """Embeds a sentence as [its length, the batch size it came in]: shows what embed() hands the batcher."""
    name = "length"

    def prepare(self, samples):
        self.prepared = samples

    def batcher(self, batch):
        return np.array([[len(s), len(batch)] for s in batch], dtype=np.float32)


def test_embed_returns_rows_in_input_order_and_embeds_each_distinct_sentence_once():
    encoder = LengthEncoder()
    assert isinstance(encoder, Encoder)
    sentences = [["a"] * 3, ["b"], ["a"] * 3, ["c"] * 2, ["d"] * 5]
    vectors = embed(encoder, sentences, batch_size=3)
    assert vectors[:, 0].tolist() == [3, 1, 3, 2, 5]
    # distinct sentences by length: b c a | d. Embedding the repeated "a a a" twice would give b c a | a d.
    assert vectors[:, 1].tolist() == [3, 3, 3, 3, 1]


def test_embed_names_the_encoder_whose_batcher_returns_the_wrong_shape():
    class Broken(LengthEncoder):
        name = "broken"

        def batcher(self, batch):
            return np.zeros((len(batch) + 1, 3))

    with pytest.raises(ValueError, match="encoder broken: batcher returned shape"):
        embed(Broken(), [["x"], ["y"]], batch_size=8)


def test_glove_bag_of_words_averages_known_words_and_needs_prepare():
    vectors = WordVectors(("good", "film"), np.array([[1.0, 0.0], [0.0, 2.0]]))
    bow = GloveBagOfWords(vectors)
    with pytest.raises(RuntimeError, match="call prepare"):
        bow.batcher([["good"]])
    bow.prepare([["good", "film", "unknownword"], ["zzz"]])
    np.testing.assert_allclose(bow.batcher([["good", "film", "unknownword"], ["zzz"], []]),
                               [[0.5, 1.0], [0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="no word of the task has a vector"):
        GloveBagOfWords(vectors).prepare([["zzz"]])


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    rng = random.Random(0)
    sentences = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}" for _ in range(200)]
    tokenizer_dir = tmp_path_factory.mktemp("tokenizer")
    tokenizer = train_wordpiece(sentences, tokenizer_dir, vocab_size=200, min_frequency=1)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    return model, tokenizer, tokenizer_dir


def test_bert_encoder_pools_cls_or_mean_and_ignores_padding(tiny_bert):
    model, tokenizer, _ = tiny_bert
    short, long = tokenize("the king saw the ship"), tokenize("the old man followed a letter to the dark forest")
    cls, mean = BertEncoder(model, tokenizer, "cls"), BertEncoder(model, tokenizer, "mean")
    for encoder in (cls, mean):
        batch = encoder.batcher([short, long])
        assert batch.shape == (2, 32)
        # alone the short sentence has no padding; beside the long one it does: same vector means padding is unseen
        np.testing.assert_allclose(encoder.batcher([short])[0], batch[0], atol=1e-5)
    assert not np.allclose(cls.batcher([short]), mean.batcher([short]), atol=1e-3)
    assert BertEncoder(model, tokenizer, "mean", max_seq_length=4).batcher([long]).shape == (1, 32)
    with pytest.raises(ValueError, match="pooling must be one of"):
        BertEncoder(model, tokenizer, "max")


def test_bert_encoder_mean_is_the_average_hidden_state_of_cls_pieces_and_sep(tiny_bert):
    model, tokenizer, _ = tiny_bert
    sentence = tokenize("my brother remembered the river")
    ids = torch.tensor([tokenizer.encode(" ".join(sentence)).ids])  # [CLS] pieces [SEP]
    with torch.no_grad():
        hidden, _ = model.eval()(ids)
    np.testing.assert_allclose(BertEncoder(model, tokenizer, "mean").batcher([sentence])[0],
                               hidden[0].mean(0).numpy(), atol=1e-5)
    np.testing.assert_allclose(BertEncoder(model, tokenizer, "cls").batcher([sentence])[0], hidden[0, 0].numpy(),
                               atol=1e-5)


def test_bert_encoder_loads_from_pipeline_directories(tiny_bert, tmp_path):
    model, tokenizer, tokenizer_dir = tiny_bert
    save_pretrained(model, tmp_path / "encoder")
    loaded = BertEncoder.from_directories(tmp_path / "encoder", tokenizer_dir, pooling="mean", name="bert_tiny_mean")
    sentence = [tokenize("the captain found the city")]
    assert loaded.name == "bert_tiny_mean"
    np.testing.assert_allclose(loaded.batcher(sentence), BertEncoder(model, tokenizer, "mean").batcher(sentence),
                               atol=1e-6)


def test_random_twin_encoder_is_the_same_architecture_freshly_initialised(tiny_bert, tmp_path):
    from models.checkpoint import random_twin

    model, tokenizer, tokenizer_dir = tiny_bert
    save_pretrained(model, tmp_path / "encoder")
    twin = BertEncoder.from_directories(tmp_path / "encoder", tokenizer_dir, pooling="mean", random_init_seed=7)
    state_before = torch.get_rng_state()
    again = random_twin(model, 7).state_dict()
    assert torch.equal(torch.get_rng_state(), state_before)  # the global RNG (dropout, data order) is left alone
    assert twin.model.config == model.config
    trained, fresh = model.state_dict(), twin.model.state_dict()
    assert trained.keys() == fresh.keys()
    assert not torch.equal(trained["encoder.layer.0.attention.self.query.weight"],
                           fresh["encoder.layer.0.attention.self.query.weight"])
    assert all(torch.equal(fresh[k], again[k]) for k in fresh)  # deterministic in the seed
    sentence = [tokenize("the captain found the city")]
    assert not np.allclose(twin.batcher(sentence), BertEncoder(model, tokenizer, "mean").batcher(sentence))


def test_every_family_offers_a_random_twin_to_the_evaluate_stage(tmp_path):
    from pipeline.evaluation.stage import ENCODERS
    from tests.helpers import tiny_config

    cfg = tiny_config(tmp_path)
    for trained in ("bert_cls", "bert_mean", "elmo", "skip_thought", "skip_thought_bi", "skip_thought_combine"):
        assert ENCODERS[f"{trained}_random"].upstream(cfg) == ENCODERS[trained].upstream(cfg)


# -----------------------------------------------------------------------------
# run_senteval end to end on synthetic files


def _sentiment_vectors(dim: int = 8) -> WordVectors:
    """Random word vectors, except that sentiment words carry +-3 on the first axis."""
    rng = np.random.default_rng(0)
    words = sorted({w for phrase in SUBJECTS + OBJECTS + VERBS for w in phrase.split()} | {"found"})
    vectors = np.concatenate([rng.normal(size=(len(words), dim)),
                              np.tile(np.eye(dim)[0] * 3, (len(POSITIVE), 1)),
                              np.tile(-np.eye(dim)[0] * 3, (len(NEGATIVE), 1))])
    return WordVectors(tuple(words + POSITIVE + NEGATIVE), vectors)


def _write_pair_tasks(root):
    rng = random.Random(0)
    rows = []
    for i in range(160):
        a = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        same = i % 2 == 0
        b = a if same else f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        rows.append((a, b, "ENTAILMENT" if same else "NEUTRAL", "5" if same else f"{rng.uniform(1, 3):.1f}",
                     ["TRAIN", "TRAIN", "TRIAL", "TEST"][i // 2 % 4]))
    _write_sick(root / "SICK.txt", rows)
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    for name, chunk in (("train.tsv", rows[:120]), ("dev.tsv", rows[120:])):
        lines = [f"{int(r[2] == 'ENTAILMENT')}\t{i}\t{i}\t{r[0]}\t{r[1]}" for i, r in enumerate(chunk)]
        (root / "MRPC").mkdir(exist_ok=True)
        (root / "MRPC" / name).write_text("\n".join([header, *lines]) + "\n")


def test_run_senteval_covers_every_task_kind_and_pivots_into_one_row_per_encoder(tmp_path, capsys):
    write_sentiment_task(tmp_path / "sentiment", n_train=200)
    _write_pair_tasks(tmp_path)
    (tmp_path / "MR").mkdir()
    (tmp_path / "MR" / "rt-polarity.pos").write_text("\n".join(f"a {w} film" for w in POSITIVE * 5))
    (tmp_path / "MR" / "rt-polarity.neg").write_text("\n".join(f"a {w} film" for w in NEGATIVE * 5))
    cfg = SentevalConfig(
        data_root=str(tmp_path), batch_size=16,
        classifier=ClassifierConfig(l2_grid=[1e-3, 1e-1], max_iter=50, cv_folds=5, inner_folds=3),
        tasks={
            "Sentiment": {"kind": "tsv", "path": "sentiment/train.tsv", "text_column": "sentence",
                          "label_column": "label", "label_names": [0, 1]},
            "MR": {"kind": "mr", "path": "MR"},
            "SICKEntailment": {"kind": "sick_entailment", "path": "SICK.txt"},
            "SICKRelatedness": {"kind": "sick_relatedness", "path": "SICK.txt"},
            "MRPC": {"kind": "mrpc", "path": "MRPC"},
        })
    rows = run_senteval([GloveBagOfWords(_sentiment_vectors()), LengthEncoder()], cfg, seed=0)
    scores = {(r["encoder"], r["task"], r["metric"]): r["score"] for r in rows}
    assert set(scores) == {(e, t, m) for e in ("glove_bow", "length") for t, m in [
        ("Sentiment", "accuracy"), ("MR", "accuracy"), ("SICKEntailment", "accuracy"),
        ("SICKRelatedness", "pearson"), ("SICKRelatedness", "spearman"), ("MRPC", "accuracy"), ("MRPC", "f1")]}
    assert scores["glove_bow", "Sentiment", "accuracy"] > 0.95
    assert scores["glove_bow", "MR", "accuracy"] > 0.95
    # identical pairs have |u - v| = 0 under any deterministic encoder, so bag-of-words separates them
    assert scores["glove_bow", "SICKEntailment", "accuracy"] > 0.9
    assert scores["glove_bow", "MRPC", "accuracy"] > 0.9
    assert scores["glove_bow", "SICKRelatedness", "pearson"] > 0.8
    assert {r["task"] for r in rows if r.get("pair_features") == ["abs_diff", "product"]} == \
        {"SICKEntailment", "SICKRelatedness", "MRPC"}
    assert all("pair_features" not in r for r in rows if r["task"] in ("Sentiment", "MR"))
    # each (encoder, task) is reported as it finishes: a long evaluate stage shows where it is
    progress = capsys.readouterr().out
    assert f"senteval glove_bow on MR: accuracy {scores['glove_bow', 'MR', 'accuracy']:.4f} (" in progress
    assert progress.count("senteval length on ") == 5

    table = results_table(rows)
    assert [row["encoder"] for row in table] == ["glove_bow", "length"]
    assert table[0]["MRPC f1"] == scores["glove_bow", "MRPC", "f1"]
    assert list(table[0])[:3] == ["encoder", "Sentiment accuracy", "MR accuracy"]


def test_trec_trains_on_train_and_scores_its_own_test_split(tmp_path):
    words = {"NUM": "many", "HUM": "who", "LOC": "where"}
    rng = random.Random(0)
    lines = [f"{label}:x {words[label]} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ?" for label in words
             for _ in range(20)]
    (tmp_path / "train_5500.label").write_text("\n".join(lines))
    (tmp_path / "TREC_10.label").write_text("\n".join(lines[::4]))
    vocabulary = sorted({w for line in lines for w in tokenize(line.split(" ", 1)[1])})
    encoder = GloveBagOfWords(WordVectors(tuple(vocabulary), np.random.default_rng(0).normal(size=(len(vocabulary),
                                                                                                   8))))
    settings = ClassifierSettings(l2_grid=(1e-3,), max_iter=50, inner_folds=3)
    read, evaluate = TASK_KINDS["trec"]
    assert evaluate(encoder, read(tmp_path, {}), settings, 16, np.random.default_rng(0))["accuracy"] > 0.9
    # the same questions with every test label rotated to a wrong class: scored on test, the accuracy collapses
    (tmp_path / "TREC_10.label").write_text("\n".join(
        line.replace("NUM:", "T:").replace("HUM:", "NUM:").replace("LOC:", "HUM:").replace("T:", "LOC:")
        for line in lines[::4]))
    assert evaluate_train_test(encoder, read(tmp_path, {}), settings, 16, np.random.default_rng(0))["accuracy"] < 0.1


def test_senteval_pair_features_reach_the_pair_classifier(tmp_path):
    _write_pair_tasks(tmp_path)
    cfg = SentevalConfig(data_root=str(tmp_path), batch_size=16,
                         classifier=ClassifierConfig(l2_grid=[1e-3], max_iter=50, cv_folds=5, inner_folds=3),
                         tasks={"MRPC": {"kind": "mrpc", "path": "MRPC"}})
    scores = {}
    for names in (["u"], ["u", "v", "abs_diff", "product"]):
        cfg.pair_features = names
        rows = run_senteval([GloveBagOfWords(_sentiment_vectors())], cfg, seed=0)
        assert {tuple(r["pair_features"]) for r in rows} == {tuple(names)}
        scores[names[-1]] = next(r["score"] for r in rows if r["metric"] == "accuracy")
    # whether b repeats a cannot be read from u alone
    assert scores["u"] < 0.75 < 0.9 < scores["product"]


def test_run_senteval_rejects_an_unknown_task_kind(tmp_path):
    cfg = SentevalConfig(tasks={"STS": {"kind": "sts", "path": "STS"}})
    with pytest.raises(ValueError, match="senteval task STS: unknown kind 'sts'"):
        run_senteval([LengthEncoder()], cfg, seed=0)


def test_default_config_names_known_task_kinds_and_reads_the_data_root_from_the_environment(monkeypatch):
    monkeypatch.setenv("TEXTREP_SHARED_DATA", "/data/shared")
    cfg = OmegaConf.structured(SentevalConfig)
    assert cfg.data_root == "/data/shared"
    assert {spec.kind for spec in cfg.tasks.values()} <= set(TASK_KINDS)
    assert ClassifierSettings.from_config(cfg.classifier).l2_grid == (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
