"""Decontamination: prepare removes the pretraining sentences that overlap the run's evaluation text, counts them per
source, and keeps everything else (train-split text included)."""
import json

import pytest
import ray

from data_prep.corpus.decontaminate import EvaluationOverlap, normalised_words
from data_prep.corpus.prepare import prepare_corpus
from data_prep.corpus.shards import MANIFEST_NAME, open_shards
from pipeline.corpus import EvaluationSources, _prepare_fingerprint, decontamination, evaluation_texts
from pipeline.engine.dag import stage_hashes
from pipeline.stages import STAGES
from tests.helpers import SENTEVAL_MR_ONLY, tiny_config, write_mr

LONG_DEV = ("the film takes its time but every scene earns the quiet ending that the whole cast seems to have "
            "been waiting for")


def test_normalisation_matches_raw_text_to_tokenised_lowercase_text():
    assert normalised_words("The Rock isn't the 21st century’s new 'Conan'!") == \
        normalised_words("the rock is n't the 21st century 's new ' conan ' !")
    assert normalised_words("Don't") != normalised_words("Do not")


def test_a_sentence_equal_to_an_evaluation_sentence_is_removed_whatever_its_case_and_punctuation():
    overlap = EvaluationOverlap.build({"toy dev": ["a gorgeous , witty , seductive movie ."]})
    removed, sources = overlap.overlapping(["A gorgeous, witty, seductive movie!", "A gorgeous, witty movie.",
                                            "A gorgeous witty seductive movie indeed."])
    assert removed.tolist() == [True, False, False]
    assert overlap.source_counts(sources[removed]) == {"toy dev": 1}


def test_a_shared_13_gram_removes_every_sentence_its_span_touches_and_a_12_gram_does_not():
    words = LONG_DEV.split()
    overlap = EvaluationOverlap.build({"toy dev": [LONG_DEV]}, n=13)
    # the dev text's words 3..15 (13 words) run across a sentence break of the corpus
    book = ["Unrelated opening words here.", " ".join(words[3:9]) + ".", " ".join(words[9:16]) + " and more.",
            "A closing line of no interest."]
    removed, _ = overlap.overlapping(book)
    assert removed.tolist() == [False, True, True, False]
    twelve = ["Something else, " + " ".join(words[3:15]) + ", then something else."]
    assert not overlap.overlapping(twelve)[0].any()
    assert EvaluationOverlap.build({"toy dev": [LONG_DEV]}, n=12).overlapping(twelve)[0].all()


def test_each_source_is_counted_apart():
    overlap = EvaluationOverlap.build({"a dev": ["it was a dark and stormy night ."],
                                       "b dev": ["it was a dark and stormy night .", "call me ishmael ."]})
    removed, sources = overlap.overlapping(["It was a dark and stormy night.", "Call me Ishmael.", "Hello there."])
    assert removed.tolist() == [True, True, False]
    assert overlap.source_counts(sources[removed]) == {"a dev": 1, "b dev": 2}


@pytest.fixture(scope="module")
def ray_running():
    if ray.is_initialized():
        yield
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield
        ray.shutdown()


def test_prepare_removes_planted_dev_sentences_counts_them_and_keeps_train_text(tmp_path, ray_running):
    dev, train = "This quiet little film is a small miracle of tact .", "The plot never quite comes together ."
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(f"First I went to the cinema. {dev.replace(' .', '.').upper()} Then home.\n\n"
                                  f"Long ago someone said {LONG_DEV} and left.\n")
    (corpus / "b.txt").write_text(f"A review of another film. {train} I was bored by it.\n")
    manifest = prepare_corpus(corpus, tmp_path / "out", num_workers=1, min_tokens=2, near_duplicates=None,
                              decontamination=EvaluationOverlap.build({"toy dev": [dev, LONG_DEV]}))
    assert manifest["decontamination"]["sentences_removed"] == 2
    assert manifest["decontamination"]["sentences_removed_by_source"] == {"toy dev": 2}
    assert json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["decontamination"] == manifest["decontamination"]
    book_a = next(f for f in manifest["files"] if f["book_id"] == "a.txt")
    assert book_a["sentences_removed_as_evaluation_text"] == 2 and book_a["sentences"] == 2
    texts = open_shards(tmp_path / "out").column("text").to_pylist()
    assert texts == ["First I went to the cinema.", "Then home.",
                     "A review of another film.", train, "I was bored by it."]


def test_without_decontamination_nothing_is_removed_and_the_manifest_says_so(tmp_path, ray_running):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(f"Long ago someone said {LONG_DEV}.\n")
    manifest = prepare_corpus(corpus, tmp_path / "out", num_workers=1, min_tokens=2, near_duplicates=None)
    assert manifest["decontamination"] is None
    assert manifest["totals"]["sentences"] == 1


def test_the_run_decontaminates_against_its_tasks_dev_split_only(tmp_path):
    cfg = tiny_config(tmp_path)
    texts = evaluation_texts(EvaluationSources.of(cfg))
    assert list(texts) == ["sst2 dev"]
    dev = (tmp_path / "task" / "dev.tsv").read_text().splitlines()[1:]
    assert texts["sst2 dev"] == [line.split("\t")[0] for line in dev]
    overlap = decontamination(cfg.data, EvaluationSources.of(cfg))
    assert overlap.overlapping([dev[0].split("\t")[0].upper() + "!"])[0].all()


def test_a_run_with_no_tasks_decontaminates_against_nothing(tmp_path):
    cfg = tiny_config(tmp_path, ["pipeline.stages=[bert_pretrain]"])
    assert evaluation_texts(EvaluationSources.of(cfg)) == {}
    assert len(decontamination(cfg.data, EvaluationSources.of(cfg))) == 0


def test_the_evaluate_stages_texts_count_where_the_run_has_it(tmp_path):
    write_mr(tmp_path / "senteval" / "MR")
    cfg = tiny_config(tmp_path, ["pipeline.stages=[bert_pretrain,evaluate]", *SENTEVAL_MR_ONLY])
    texts = evaluation_texts(EvaluationSources.of(cfg))
    assert list(texts) == ["senteval MR"] and len(texts["senteval MR"]) == 2 * 10 * 3


def test_prepares_cache_key_holds_the_evaluation_text_and_the_switch(tmp_path):
    cfg = tiny_config(tmp_path)
    key = _prepare_fingerprint(cfg)
    assert _prepare_fingerprint(tiny_config(tmp_path, ["data.decontaminate=false"])) != key
    prepare_key = stage_hashes(cfg, STAGES, ["prepare"])["prepare"]
    assert stage_hashes(tiny_config(tmp_path, ["data.decontamination_ngram=8"]), STAGES, ["prepare"])["prepare"] \
        != prepare_key
    dev = tmp_path / "task" / "dev.tsv"
    dev.write_text(dev.read_text() + "a brand new dev sentence\t1\n")
    assert _prepare_fingerprint(tiny_config(tmp_path)) != key
