"""The seq2seq family's generation task: the built-in bbc_headlines split, its dev and test articles kept out of the
pretraining text, and the pipeline fine-tuning the pretrained encoder-decoder beside its random twin and the lead-N
baseline, decoded by beam search and scored by ROUGE and BLEU, with generations in the report."""
from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data_prep.corpus.builtin.bbc_news import bbc_headline_rows
from data_prep.corpus.decontaminate import EvaluationOverlap
from data_prep.corpus.prepare import prepare_corpus
from data_prep.corpus.shards import open_shards
from data_prep.examples.gpt_blocks import END_OF_TEXT, train_byte_level_bpe
from models.generation import Hypothesis
from models.rnn_seq2seq import RNNEncoderDecoder, rnn_seq2seq_config
from pipeline import CONF_DIR
from pipeline.corpus import EvaluationSources, evaluation_texts
from pipeline.downstream import generation
from pipeline.downstream.baselines import lead_n_scores
from pipeline.downstream.finetune import finetune_upstream
from pipeline.downstream.generation import GenerationModule, output_summary, task_decoding
from pipeline.downstream.tasks import TaskSplit, load_task, scoring_options
from pipeline.engine.dag import run_dag
from pipeline.engine.pretraining import merged_settings
from pipeline.evaluation.metrics import exact_match, exact_text, generation_scores, score_task
from pipeline.runner import validate
from pipeline.seq2seq.downstream import encode_texts
from pipeline.stages import STAGES
from tests.helpers import ENDINGS, OBJECTS, SUBJECTS, VERBS, family_config


def test_bbc_articles_become_body_to_headline_pairs_split_80_10_10_by_a_fixed_seed():
    articles = {f"bbcnews/data/business/{i:03d}.txt": f"Headline {i}\n\nBody of {i} first.\n\nAnd more {i}.\n"
                for i in range(100)}
    articles["bbcnews/data/tech/001.txt"] = articles["bbcnews/data/business/007.txt"]  # the release repeats a few
    articles["bbcnews/data/tech/002.txt"] = "\n\n"
    splits = bbc_headline_rows(articles)
    assert {name: len(rows) for name, rows in splits.items()} == {"train": 80, "dev": 10, "test": 10}
    pairs = [pair for rows in splits.values() for pair in rows]
    assert sorted(pairs) == sorted((f"Body of {i} first. And more {i}.", f"Headline {i}") for i in range(100))
    assert bbc_headline_rows(dict(reversed(articles.items()))) == splits  # the split depends on the data alone


def test_generation_scores_are_rouge_and_bleu_fractions():
    assert generation_scores(["the cat sat"], ["the cat sat"]) == pytest.approx(
        {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0, "bleu": 0.0, "exact_match": 1.0},
        abs=1e-9)  # BLEU-4 of 3 words: no 4-gram
    scores = generation_scores(["the cats were sitting on a mat today"], ["the cat sat on the mat today"])
    assert scores["rouge1"] == pytest.approx(2 * (5 / 8) * (5 / 7) / (5 / 8 + 5 / 7))  # stemmed: cats = cat, sat !=
    assert 0 < scores["bleu"] < 1


def test_exact_match_counts_outputs_equal_to_their_reference_after_whitespace_and_the_tasks_case():
    predictions = ["2004-03-01", "  2004-03-01 ", "2004 03 01", "March 1, 2004", "Blair to  face MPs"]
    references = ["2004-03-01", "2004-03-01", "2004-03-01", "2004-03-01", "blair to face mps"]
    assert exact_match(predictions, references) == pytest.approx(2 / 5)  # punctuation and case count
    assert exact_match(predictions, references, ignore_case=True) == pytest.approx(3 / 5)
    assert exact_text(" Blair\tto  face ", ignore_case=True) == "blair to face"
    scores = score_task("rouge_bleu", predictions, references, ignore_case=True)
    assert list(scores) == ["rouge1", "rouge2", "rougeL", "bleu", "exact_match"]  # rouge1 stays the main metric
    assert scores["exact_match"] == pytest.approx(3 / 5) and scores["rougeL"] > scores["exact_match"]


def test_a_tasks_yaml_says_whether_exact_match_ignores_case():
    task = load_task("bbc_headlines")
    assert scoring_options(task) == {"ignore_case": True}
    assert scoring_options(OmegaConf.merge(task, {"exact_match_ignore_case": False})) == {"ignore_case": False}
    assert scoring_options(load_task("sst2")) == {}  # other tasks' metrics take no options


def test_the_output_summary_makes_a_model_that_writes_one_phrase_for_every_input_visible():
    one_phrase = output_summary(["Blair to the UK"] * 12)
    assert one_phrase == {"outputs": 12, "distinct": 1, "distinct_share": round(1 / 12, 4), "empty": 0,
                          "empty_share": 0.0, "top": [["Blair to the UK", 12]]}
    summary = output_summary(["a b", "", "c", "a  b", "", "d", "e", "f", "c", "a b"], top=3)
    assert summary["top"] == [["a b", 3], ["", 2], ["c", 2]]  # whitespace collapsed; ties as first written
    assert (summary["distinct"], summary["distinct_share"], summary["empty_share"]) == (6, 0.6, 0.2)


def test_dev_headlines_are_decoded_with_the_beam_length_penalty_and_blocking_the_tasks_yaml_states(monkeypatch):
    """What fine-tuning's dev decoding reads from tasks/bbc_headlines.yaml reaches beam search: GNMT's alpha of 1.0
    was chosen on dev (5.0 words a headline against the references' 5.1; 4.8 at the 0.6 before), and unigram blocking
    (ROUGE-L 0.2008 against 0.1897 without)."""
    decoding = task_decoding(load_task("bbc_headlines"))
    assert decoding == {"num_beams": 4, "length_penalty": 1.0, "no_repeat_ngram_size": 1}
    searched = []

    def spy(model, source, max_new_tokens, **options):
        searched.append((source, max_new_tokens, options))
        return [Hypothesis(tokens=[5, 2], log_prob=-1.0, score=-1.0, finished=True)]

    monkeypatch.setattr(generation, "beam_search", spy)
    model = RNNEncoderDecoder(rnn_seq2seq_config("rnn_attn_tiny", vocab_size=16, embedding_dim=8, hidden_size=8))
    tokenizer = type("Pieces", (), {"decode": lambda self, ids: " ".join(f"w{i}" for i in ids)})()
    module = GenerationModule(model, "rouge_bleu", tokenizer, dev_inputs=[[7, 8, 2]], dev_sources=["a b"],
                              references=["w5"], samples_path=Path("unused"), max_new_tokens=24, lr=1e-3,
                              weight_decay=0.0, warmup_steps=0, total_steps=1, **decoding)
    module.validation_step({"index": torch.tensor([0])}, 0)
    assert searched == [([7, 8, 2], 24, {"num_beams": 4, "alpha": 1.0, "no_repeat_ngram_size": 1})]
    assert module._generated == {0: "w5"}


def test_lead_n_chooses_n_on_train():
    task = load_task("bbc_headlines")
    train = TaskSplit([f"w{i} x{i} y{i} and then much more" for i in range(20)], None,
                      [f"w{i} x{i} y{i}" for i in range(20)])
    dev = TaskSplit(["a b c d e"], None, ["a b"])
    n, scores = lead_n_scores(task, train, dev)
    assert n == 3 and scores["rougeL"] == pytest.approx(0.8)  # "a b c" against "a b"
    assert scores["exact_match"] == 0.0


def test_a_headlines_first_word_is_encoded_as_the_same_pieces_as_in_its_article(tmp_path):
    # copy attention copies source pieces: the headline's first word must not be other pieces than inside the text
    text = "German telecoms firm Deutsche Telekom saw strong profits. Deutsche Telekom said sales rose."
    tokenizer = train_byte_level_bpe([text] * 50, tmp_path, vocab_size=400, min_frequency=2)
    eos = tokenizer.token_to_id(END_OF_TEXT)
    source, target = encode_texts(tokenizer, [text, "Deutsche Telekom sees gain"], max_len=64, eos=eos)
    first_word = tokenizer.encode(" Deutsche").ids
    assert target[:len(first_word)].tolist() == first_word
    assert " ".join(map(str, first_word)) in " ".join(map(str, source.tolist()))
    assert target[-1] == source[-1] == eos
    assert tokenizer.decode(target[:-1].tolist()).strip() == "Deutsche Telekom sees gain"


def write_headline_task(root: Path, seed: int = 0) -> Path:
    """bbc_headlines' layout: source (an "article" of sentences) and target (its first sentence's subject and
    verb, as a headline)."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    for name, n in (("train.tsv", 96), ("dev.tsv", 12), ("test.tsv", 12)):
        rows = ["source\ttarget"]
        for _ in range(n):
            subject, verb = rng.choice(SUBJECTS), rng.choice(VERBS)
            article = " ".join(f"{s} {v} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}." for s, v in
                               [(subject.capitalize(), verb), *((rng.choice(SUBJECTS).capitalize(),
                                                                 rng.choice(VERBS)) for _ in range(3))])
            rows.append(f"{article}\t{subject.capitalize()} {verb}")
        (root / name).write_text("\n".join(rows) + "\n")
    return root


def test_the_tasks_dev_and_test_articles_and_headlines_are_removed_from_pretraining(tmp_path, ray_session):
    task_dir = write_headline_task(tmp_path / "bbc")
    cfg = family_config(tmp_path, "seq2seq", ["finetune.task=bbc_headlines", f"finetune.data_dir={task_dir}",
                                              "pipeline.stages=[seq2seq_pretrain,finetune]"])
    texts = evaluation_texts(EvaluationSources.of(cfg))
    assert list(texts) == ["bbc_headlines dev", "bbc_headlines test"]
    split = {name: [line.split("\t") for line in (task_dir / f"{name}.tsv").read_text().splitlines()[1:]]
             for name in ("train", "dev", "test")}
    assert set(texts["bbc_headlines test"]) == {text for row in split["test"] for text in row}
    corpus = tmp_path / "bbc_corpus"  # the articles as books_builtin holds them: the headline, then the body
    corpus.mkdir()
    long_train = ("the committee said on monday that the new rules would come into force across the country "
                  "next spring")
    for name, rows in split.items():
        for i, (source, target) in enumerate(rows[:3]):
            extra = f" And {long_train}." if name == "train" else ""
            (corpus / f"{name}-{i}.txt").write_text(f"{target}\n\n{source}{extra}\n")
    manifest = prepare_corpus(corpus, tmp_path / "out", num_workers=1, min_tokens=2, near_duplicates=None,
                              decontamination=EvaluationOverlap.build(texts, 13))
    removed = manifest["decontamination"]["sentences_removed_by_source"]
    assert removed["bbc_headlines dev"] > 0 and removed["bbc_headlines test"] > 0
    kept = open_shards(tmp_path / "out").column("book_id").to_pylist()
    assert not any(book.startswith(("dev-", "test-")) for book in kept)  # every sentence of theirs removed
    assert {f"train-{i}.txt" for i in range(3)} <= set(kept)


def test_seq2seq_tiny_is_fine_tuned_on_headlines_beside_its_twin_and_lead_n_and_reported(tmp_path, ray_session):
    task_dir = write_headline_task(tmp_path / "bbc")
    cfg = family_config(tmp_path, "seq2seq", [
        f"finetune.data_dir={task_dir}", "finetune.task=bbc_headlines", "finetune.seeds=[1,2]",
        "finetune.max_seq_length=32", "finetune.epochs=2", "finetune.lr=3e-3", "finetune.batch_size=16",
        "pipeline.stages=[seq2seq_pretrain,finetune,report]", "pretrain.max_steps=20"])
    validate(cfg)
    results = run_dag(cfg, STAGES, tmp_path / "run")
    assert [s for s in results if s != "word2vec"] == ["prepare", "seq2seq_tokenizer", "seq2seq_examples",
                                                       "seq2seq_pretrain", "finetune", "report"]
    finetune_dir = tmp_path / "run" / "finetune"
    rows = json.loads((finetune_dir / "results.json").read_text())
    scores = {(r["model"], r["metric"]): r for r in rows}
    assert set(scores) == {(model, metric) for model in ("seq2seq", "seq2seq_random", "lead_n")
                           for metric in ("rouge1", "rouge2", "rougeL", "bleu", "exact_match")}
    assert scores[("lead_n", "rougeL")]["score"] > 0.9  # the headline is the first three or four words
    assert scores[("seq2seq", "rougeL")]["seeds"] == 2 and scores[("seq2seq", "rougeL")]["dev_examples"] == 12
    assert all(0 <= r["score"] <= 1 for r in rows)
    with open(finetune_dir / "generated" / "bbc_headlines-seq2seq.tsv", encoding="utf-8", newline="") as f:
        generated = list(csv.DictReader(f, delimiter="\t"))
    dev = [line.split("\t") for line in (task_dir / "dev.tsv").read_text().splitlines()[1:]]
    assert [g["reference"] for g in generated] == [target for _, target in dev]
    # every seed's finished/ file carries the summary of what that seed wrote; the samples file is the last seed's
    last = json.loads((finetune_dir / "finished" / "bbc_headlines-seq2seq-all-seed2.json").read_text())
    assert {json.dumps(r["output_summary"]) for r in last} == {json.dumps(output_summary(
        [g["generated"] for g in generated]))}
    written = scores[("seq2seq", "exact_match")]
    assert written["output_summary"]["seed"] == 1 and written["output_summary"]["outputs"] == 12
    assert len(written["distinct_share_per_seed"]) == 2
    assert written["distinct_share_per_seed"][1] == last[0]["output_summary"]["distinct_share"]
    # the last seed's exact match, from its outputs: the task ignores case (exact_match_ignore_case)
    assert written["per_seed"][1] == pytest.approx(sum(g["generated"].lower() == g["reference"].lower()
                                                       for g in generated) / 12, abs=1e-4)
    lead_n = scores[("lead_n", "rougeL")]
    assert lead_n["output_summary"]["outputs"] == 12 and lead_n["output_summary"]["seed"] is None
    assert lead_n["distinct_share_per_seed"] == [lead_n["output_summary"]["distinct_share"]]
    report = (tmp_path / "run" / "report" / "results.md").read_text()
    assert "## Generated: bbc_headlines" in report and dev[0][1] in report and "lead_n" in report
    assert "## What each model writes: bbc_headlines" in report
    section = report[report.index("## What each model writes"):report.index("## Generated")]
    assert [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:] \
        == ["| seq2seq", "| seq2seq_random", "| lead_n"]


def test_selection_fraction_scores_a_generation_task_and_lead_n_on_held_out_train_pairs(tmp_path, ray_session):
    """finetune.selection_fraction refused a generation task, so bbc_headlines' settings could only be chosen on dev."""
    task_dir = write_headline_task(tmp_path / "bbc")  # 96 train pairs, 12 dev
    cfg = family_config(tmp_path, "seq2seq", [
        f"finetune.data_dir={task_dir}", "finetune.task=bbc_headlines", "finetune.seeds=[1]",
        "finetune.selection_fraction=0.25", "finetune.max_seq_length=32", "finetune.epochs=1",
        "finetune.batch_size=16", "pipeline.stages=[seq2seq_pretrain,finetune]", "pretrain.max_steps=4",
        "pretrain.val_every_steps=2", "finetune.random_twins=false"])
    validate(cfg)
    run_dag(cfg, STAGES, tmp_path / "run")
    rows = json.loads((tmp_path / "run" / "finetune" / "results.json").read_text())
    assert {(r["model"], r["train_examples"], r["dev_examples"], r["scored_on"]) for r in rows} == {
        ("seq2seq", 72, 24, "train_holdout"), ("lead_n", 72, 24, "train_holdout")}
    with open(tmp_path / "run" / "finetune" / "generated" / "bbc_headlines-seq2seq.tsv", encoding="utf-8",
              newline="") as f:
        references = [g["reference"] for g in csv.DictReader(f, delimiter="\t")]
    train = [line.split("\t")[1] for line in (task_dir / "train.tsv").read_text().splitlines()[1:]]
    dev = [line.split("\t")[1] for line in (task_dir / "dev.tsv").read_text().splitlines()[1:]]
    assert len(references) == 24 and set(references) <= set(train) and not set(references) & (set(dev) - set(train))


def test_seq2seq_tiny_fine_tunes_gpt_beside_it_with_gpts_own_recipe():
    """The experiment's decoder-only baseline: gpt_tiny pretrained on the same prepare output for its own 500 steps
    (the encoder-decoder's 1,500 were chosen for it on dev) with its own schedule (GPT reads pretrain's keys where
    gpt.pretrain leaves them null: not seed 000's Noam)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=seq2seq_tiny"])
    assert list(cfg.finetune.models) == ["seq2seq", "gpt"] and cfg.gpt.model.config.name == "gpt_tiny"
    assert "gpt_pretrain" in finetune_upstream(cfg)
    gpt = merged_settings(cfg, ("pretrain", "gpt.pretrain"))
    assert (gpt.lr_decay, gpt.max_steps, list(gpt.betas)) == ("linear", 500, [0.9, 0.95])
    assert cfg.pretrain.max_steps == 1500
    assert cfg.pretrain.lr_decay == "noam"


def test_train_sizes_draw_a_rouge_l_curve_of_the_encoder_decoder_its_twin_and_a_flat_lead_n(tmp_path, ray_session,
                                                                                             monkeypatch):
    """Issue 52, item 4: finetune.train_sizes on a generation task. Each kind trains on the same random pairs at a
    size and seed; lead-N, which trains nothing, is fitted once and set beside every size; the report's curve and
    its first table read ROUGE-L, and say that the twin is the control. The sizes are given largest first: they run
    smallest first. The generations kept (generated/) are the headline run's, the last seed at the largest size, in
    whatever order the runs finish (finetune.parallel_runs): here the grid is handed over reversed, headline first."""
    from pipeline.downstream import finetune as finetuning
    from tests.helpers import TinyRun

    task_dir = write_headline_task(tmp_path / "bbc")  # 96 train pairs, 12 dev
    run = TinyRun(family_config(tmp_path, "seq2seq", [
        f"finetune.data_dir={task_dir}", "finetune.task=bbc_headlines", "finetune.seeds=[1,2]",
        "finetune.train_sizes=[null,24]", "finetune.max_seq_length=32", "finetune.epochs=1",
        "finetune.batch_size=16", "pipeline.stages=[seq2seq_pretrain,finetune,report]", "pretrain.max_steps=4",
        "pretrain.val_every_steps=2", "finetune.parallel_runs=1"]))  # one process, where the calls are recorded
    trained_on, calls, grid = {}, [], []
    fine_tune, train_runs = finetuning.finetune_once, finetuning.train_runs

    def recording(ctx, f, task, data, models, kind, seed, train_indices, keeps_outputs):
        trained_on[kind, len(train_indices), seed] = sorted(tuple(data.train[i]["target"].tolist())
                                                            for i in train_indices)
        calls.append((kind, len(train_indices), seed))
        return fine_tune(ctx, f, task, data, models, kind, seed, train_indices, keeps_outputs)

    def reversed_grid(ctx, f, unfinished, sources, workers):
        grid.extend((run.kind, run.size, run.seed, run.keeps_outputs) for run, _ in unfinished)
        return train_runs(ctx, f, unfinished[::-1], sources, workers)

    monkeypatch.setattr(finetuning, "finetune_once", recording)
    monkeypatch.setattr(finetuning, "train_runs", reversed_grid)
    for name in run.plan.order:
        run.run_stage(name)

    assert grid == [(kind, size, seed, (size, seed) == (None, 2)) for kind in ("seq2seq", "seq2seq_random")
                    for size in (24, None) for seed in (1, 2)]
    assert calls == [(kind, size, seed) for kind in ("seq2seq_random", "seq2seq") for size in (96, 24)
                     for seed in (2, 1)]
    for seed in (1, 2):  # the same pairs for both kinds: the rows differ by the pretraining alone
        assert trained_on["seq2seq", 24, seed] == trained_on["seq2seq_random", 24, seed]
    assert trained_on["seq2seq", 24, 1] != trained_on["seq2seq", 24, 2]  # a random subset per seed
    assert len(set(trained_on["seq2seq", 24, 1])) > 20  # 24 pairs, of which a few headlines repeat
    finetune_dir = run.stage_dir("finetune")
    rows = json.loads((finetune_dir / "results.json").read_text())
    rouge_l = {(r["model"], r["train_size"]): r for r in rows if r["metric"] == "rougeL"}
    assert set(rouge_l) == {("seq2seq", 24), ("seq2seq", None), ("seq2seq_random", 24), ("seq2seq_random", None),
                            ("lead_n", None)}  # lead-N once: it trains nothing
    assert [rouge_l["seq2seq", size]["train_examples"] for size in (24, None)] == [24, 96]
    assert rouge_l["seq2seq", 24]["control"] == "seq2seq_random"  # the twin is the control
    assert rouge_l["seq2seq", 24]["seeds"] == 2
    # the generations kept are the headline size's last seed
    last = json.loads((finetune_dir / "finished" / "bbc_headlines-seq2seq-all-seed2.json").read_text())
    with open(finetune_dir / "generated" / "bbc_headlines-seq2seq.tsv", encoding="utf-8", newline="") as f:
        assert output_summary([g["generated"] for g in csv.DictReader(f, delimiter="\t")]) == \
            last[0]["output_summary"]

    report = (run.stage_dir("report") / "results.md").read_text()
    assert (run.stage_dir("report") / "label_efficiency.png").stat().st_size > 1000
    section = report[report.index("## Label efficiency"):report.index("## What each model writes")]
    lead_n = rouge_l["lead_n", None]["score"]
    table = section.split("\n\n")[1:3]
    assert table[0] == "bbc_headlines rougeL, 2 seeds:"  # the figure's metric first
    assert table[1].splitlines() == [
        "| model | 24 | 96 |", "|---|---|---|",
        *(f"| {kind} | {rouge_l[kind, 24]['score']:.4f} ± {rouge_l[kind, 24]['std']:.4f} | "
          f"{rouge_l[kind, None]['score']:.4f} ± {rouge_l[kind, None]['std']:.4f} |"
          for kind in ("seq2seq", "seq2seq_random")),
        f"| lead_n (trains nothing: the same at every size; fitted on all 96 train examples) | {lead_n:.4f} | "
        f"{lead_n:.4f} |"]
    assert "seq2seq_random is the control too: pretraining started from random initialisation." in section
    gain = rouge_l["seq2seq", 24]["score"] - rouge_l["seq2seq_random", 24]["score"]
    assert (f"- bbc_headlines rougeL, 24 examples: seq2seq - seq2seq_random = {gain:+.4f} (ahead on "
            in section)
    assert f"seq2seq - lead_n = {rouge_l['seq2seq', 24]['score'] - lead_n:+.4f}" in section
    # what each model writes: at the headline's size, all 96 pairs, per kind
    writes = report[report.index("## What each model writes"):report.index("## Generated")]
    first = json.loads((finetune_dir / "finished" / "bbc_headlines-seq2seq-all-seed1.json").read_text())[0]
    summary = first["output_summary"]
    assert (f"| seq2seq | 1 | {summary['distinct_share']:.3f} = {summary['distinct']} of 12 (per seed "
            f"{summary['distinct_share']:.3f} / {last[0]['output_summary']['distinct_share']:.3f})") in writes
    assert [line.split(" | ")[0] for line in writes.splitlines() if line.startswith("| ") and "---" not in line][1:] \
        == ["| seq2seq", "| seq2seq_random", "| lead_n"]
