"""GPT-1 fine-tuning (Radford et al. 2018, Sec. 3.2-3.3): input transformations, the extract-token head, the
auxiliary LM loss, and the `gpt` / `gpt_random` kinds in the fine-tune stage."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tokenizers import ByteLevelBPETokenizer

from models import IGNORE_INDEX
from models.gpt import GPTForSequenceClassification, GPTLMHeadModel, gpt_config, save_pretrained
from pipeline import CONF_DIR
from pipeline.downstream import finetune as finetuning
from pipeline.engine.dag import StageContext
from pipeline.gpt.downstream import GPTClassificationModule, collate, load_task_data, transform
from tests.helpers import NEGATIVE, OBJECTS, POSITIVE, SUBJECTS, write_sentiment_task

S, D, E = 100, 101, 102  # start, delimiter, extract


def test_single_sentences_are_framed_by_start_and_extract():
    assert transform([1, 2, 3], None, (S, D, E), 16, both_orders=False) == [[S, 1, 2, 3, E]]
    assert transform([1, 2, 3, 4, 5], None, (S, D, E), 5, both_orders=False) == [[S, 1, 2, 3, E]]


def test_pairs_get_a_delimiter_and_similarity_pairs_both_orders():
    assert transform([1, 2], [3], (S, D, E), 16, both_orders=False) == [[S, 1, 2, D, 3, E]]
    assert transform([1, 2], [3], (S, D, E), 16, both_orders=True) == [[S, 1, 2, D, 3, E], [S, 3, D, 1, 2, E]]
    # cut to fit, the longer text first
    assert transform([1, 2, 3, 4], [5, 6], (S, D, E), 7, both_orders=False) == [[S, 1, 2, D, 5, 6, E]]


def _model(num_labels=2, seed=0, pooling="last") -> GPTForSequenceClassification:
    torch.manual_seed(seed)
    return GPTForSequenceClassification(gpt_config("gpt_tiny", vocab_size=103, n_positions=32, n_embd=32, n_head=2),
                                        num_labels, pooling).eval()


def test_the_head_reads_the_extract_token_and_right_padding_changes_nothing():
    model = _model()
    short, long = {"sequences": [[S, 5, 6, E]], "label": 0}, {"sequences": [[S, 7, 8, 9, 10, 11, E]], "label": 1}
    with torch.no_grad():
        alone = collate([short])
        logits_alone, lm_alone = model(alone["input_ids"], alone["last"])
        batch = collate([short, long])
        assert batch["input_ids"].shape == (2, 1, 7) and batch["last"].tolist() == [[3], [6]]
        logits_batch, _ = model(batch["input_ids"], batch["last"])
        torch.testing.assert_close(logits_batch[:1], logits_alone)
        # the extract state is the one read: the head applied to it by hand gives the logits
        h = model.encoder(alone["input_ids"][:, 0])
        torch.testing.assert_close(model.head(h[:, 3]), logits_alone)
        # padding tokens are not LM targets: other padding ids give the same LM loss for the short row
        padded = batch["input_ids"][:1].clone()
        padded[0, 0, 4:] = 42
        _, lm_padded = model(padded, batch["last"][:1])
        _, lm_zero = model(batch["input_ids"][:1], batch["last"][:1])
        torch.testing.assert_close(lm_padded, lm_zero)
        torch.testing.assert_close(lm_zero, lm_alone)


def test_both_orders_are_summed_before_the_head():
    model = _model(num_labels=1)
    with torch.no_grad():
        batch = collate([{"sequences": [[S, 1, 2, D, 3, E], [S, 3, D, 1, 2, E]], "label": 0.5}])
        logits, _ = model(batch["input_ids"], batch["last"])
        h = model.encoder(batch["input_ids"][0])  # (2, T, C)
        torch.testing.assert_close(logits, model.head(h[0, 5] + h[1, 5])[None])


def test_mean_pooling_reads_the_mean_of_the_final_states_from_start_to_extract():
    """finetune.gpt_pooling=mean: every real token's final state, none of the padding after the extract token."""
    model = _model(pooling="mean")
    short, long = {"sequences": [[S, 5, 6, E]], "label": 0}, {"sequences": [[S, 7, 8, 9, 10, 11, E]], "label": 1}
    with torch.no_grad():
        batch = collate([short, long])
        logits, _ = model(batch["input_ids"], batch["last"])
        h = model.encoder(batch["input_ids"][:, 0])
        torch.testing.assert_close(logits, model.head(torch.stack([h[0, :4].mean(0), h[1].mean(0)])))
        alone = collate([short])
        torch.testing.assert_close(model(alone["input_ids"], alone["last"])[0], logits[:1])


def test_the_embedding_mean_is_read_normalised_beside_the_extract_state_and_pairs_are_summed():
    """finetune.gpt_pooling=last_embedding_mean: [extract state; LayerNorm(mean of the tokens' embeddings)] -> a head
    twice as wide; a similarity pair's two orders summed, as their extract states are with `last`."""
    model = _model(num_labels=1, pooling="last_embedding_mean")
    assert model.head.in_features == 2 * model.config.n_embd
    torch.nn.init.normal_(model.embedding_norm.weight)  # not the identity's gain, so that the test sees it applied
    with torch.no_grad():
        batch = collate([{"sequences": [[S, 1, 2, D, 3, E], [S, 3, D, 1, 2, E]], "label": 0.5},
                         {"sequences": [[S, 1, 2, 4, D, 3, 4, E], [S, 3, 4, D, 1, 2, 4, E]], "label": 0.1}])
        assert batch["last"].tolist() == [[5, 5], [7, 7]]  # the first pair is padded at 6 and 7
        logits, _ = model(batch["input_ids"], batch["last"])
        ids = batch["input_ids"][0]
        h = model.encoder(ids)
        means = model.encoder.wte(ids[:, :6]).mean(1)  # (2, C): the 6 real tokens of each order
        pooled = torch.cat([h[:, 5], model.embedding_norm(means)], -1).sum(0)
        torch.testing.assert_close(logits[:1], model.head(pooled)[None])


def test_an_unknown_pooling_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="pooling must be one of .*'last'.*got 'cls'"):
        _model(pooling="cls")


@pytest.mark.parametrize("lm_loss_weight", [0.5, 0.0, 2.0])
def test_the_loss_is_the_task_loss_plus_lambda_times_the_lm_loss(lm_loss_weight):
    """finetune.lm_loss_weight: GPT-1's L3 = L2 + λ L1 (Sec. 3.2), λ = 0.5 in the paper; at 0 the task's loss alone."""
    model = _model()
    module = GPTClassificationModule(model, metric="accuracy", lr=1e-3, weight_decay=0.0, warmup_steps=0,
                                     total_steps=1, lm_loss_weight=lm_loss_weight)
    batch = collate([{"sequences": [[S, 5, 6, E]], "label": 1}, {"sequences": [[S, 7, 8, 9, E]], "label": 0}])
    with torch.no_grad():
        loss, _ = module.model_step(batch)
        ids = batch["input_ids"][:, 0]
        h = model.encoder(ids)
        task = F.cross_entropy(model.head(h[torch.arange(2), batch["last"][:, 0]]), batch["labels"])
        targets = ids[:, 1:].clone()
        targets[0, 3:] = IGNORE_INDEX  # row 0 ends at position 3: its padding is no target
        lm = F.cross_entropy((h[:, :-1] @ model.encoder.wte.weight.T).flatten(0, 1), targets.flatten(),
                             ignore_index=IGNORE_INDEX)
    assert lm > 1.0  # a random model's next-token loss: λ x it moves the loss by more than rounding
    torch.testing.assert_close(loss, task + lm_loss_weight * lm)
    assert module.hparams.lm_loss_weight == lm_loss_weight  # saved with the module's other settings


def test_pretrained_weights_are_loaded_and_the_special_tokens_added():
    config = gpt_config("gpt_tiny", vocab_size=100, n_positions=32, n_embd=32, n_head=2)
    lm = GPTLMHeadModel(config)
    model = _model()
    model.load_lm(lm)
    torch.testing.assert_close(model.encoder.wte.weight[:100], lm.transformer.wte.weight)
    torch.testing.assert_close(model.encoder.h[0].attn.c_attn.weight, lm.transformer.h[0].attn.c_attn.weight)
    assert model.special_ids == (100, 101, 102)


WORDS = SUBJECTS + OBJECTS + POSITIVE + NEGATIVE + ["found"]


def _tokenizer(path: Path) -> ByteLevelBPETokenizer:
    rng = random.Random(0)
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator([" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(300)],
                                  vocab_size=600, min_frequency=1, special_tokens=["<|endoftext|>"])
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    return tokenizer


def test_squad_is_refused_naming_the_task(tmp_path):
    task = OmegaConf.create({"name": "squad_v1", "format": "squad"})
    with pytest.raises(ValueError, match="squad_v1: squad tasks are not supported for gpt"):
        load_task_data(task, tmp_path, _tokenizer(tmp_path / "tok"), 32, 16, None, 0)


@pytest.fixture
def ctx(tmp_path) -> StageContext:
    model_dir = tmp_path / "gpt_pretrain" / "model"
    tokenizer = _tokenizer(model_dir)
    torch.manual_seed(0)
    save_pretrained(GPTLMHeadModel(gpt_config("gpt_tiny", vocab_size=tokenizer.get_vocab_size(), n_positions=32,
                                              n_embd=32, n_head=2)), model_dir)
    glue = tmp_path / "glue"
    write_sentiment_task(glue / "SST-2", n_train=160, n_dev=40)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "+experiment=bert_tiny", f"paths.run_dir={tmp_path}", f"paths.cache_dir={tmp_path / 'cache'}",
            "logger=csv", "trainer.precision=32-true", "finetune.task=[sst2]", f"finetune.data_dir={glue}",
            "finetune.models=[gpt,gpt_random]", "finetune.seeds=[1]", "finetune.train_sizes=[null]",
            "finetune.min_steps=0", "finetune.epochs=8", "finetune.batch_size=16", "finetune.max_seq_length=32",
            "finetune.lr=2e-3", "finetune.baselines=[majority_class,bow_logreg]",
            "pretrain.init_embeddings=random"])  # bert_tiny's piece vectors would be GPT's start too
    out = tmp_path / "finetune"
    out.mkdir()
    return StageContext(cfg, "finetune", out, {"gpt_pretrain": tmp_path / "gpt_pretrain"})


def test_finetune_stage_scores_gpt_and_gpt_random_and_gpt_learns_sentiment(ctx):
    rows = {(r["model"], r["metric"]): r["score"] for r in finetuning.finetune(ctx)["results"]}
    assert {("gpt", "accuracy"), ("gpt_random", "accuracy")} <= set(rows)
    assert rows[("gpt", "accuracy")] > rows[("majority_class", "accuracy")]


def _write_pairs(root: Path) -> Path:
    """STS-B layout: a float similarity score for a sentence pair."""
    root.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (root / name).write_text("index\tsentence1\tsentence2\tscore\n0\talice found\tbob found\t1.5\n")
    return root


STSB = {"name": "stsb", "format": "tsv", "train_file": "train.tsv", "dev_file": "dev.tsv", "text_a": "sentence1",
        "text_b": "sentence2", "label": "score", "labels": None, "metric": "pearson_spearman"}


def test_a_regression_pair_is_encoded_in_both_orders_and_trained_with_mse_plus_lm(tmp_path):
    tokenizer = _tokenizer(tmp_path / "tok")
    data = load_task_data(OmegaConf.create(STSB), _write_pairs(tmp_path / "stsb"), tokenizer, 32, 32, None, 0)
    a, b = tokenizer.encode("alice found").ids, tokenizer.encode("bob found").ids
    v = tokenizer.get_vocab_size()
    assert data.train[0]["sequences"] == [[v, *a, v + 1, *b, v + 2], [v, *b, v + 1, *a, v + 2]]
    model = data.make_model(gpt_config("gpt_tiny", vocab_size=v, n_positions=32, n_embd=32, n_head=2)).eval()
    module = data.make_module(model, lr=1e-3, weight_decay=0.0, warmup_steps=0, total_steps=1)
    batch = data.collate(data.train)
    with torch.no_grad():
        loss, scores = module.model_step(batch)
        _, lm = model(batch["input_ids"], batch["last"])
    torch.testing.assert_close(loss, F.mse_loss(scores, batch["labels"]) + 0.5 * lm)


@pytest.mark.parametrize("name, both_orders", [("mrpc", True), ("qqp", True), ("rte", False)])
def test_paraphrase_pairs_get_both_orders_and_entailment_pairs_one(tmp_path, name, both_orders):
    """GPT-1 Sec. 3.3: similarity (MRPC, QQP) has no inherent order; entailment has one, premise first."""
    root = tmp_path / name
    root.mkdir()
    for split in ("train.tsv", "dev.tsv"):
        (root / split).write_text("sentence1\tsentence2\tlabel\nalice found\tbob found\t1\nbob found\talice\t0\n")
    task = OmegaConf.create({**STSB, "name": name, "label": "label", "labels": ["0", "1"], "metric": "accuracy"})
    tokenizer = _tokenizer(tmp_path / "tok")
    data = load_task_data(task, root, tokenizer, 32, 32, None, 0)
    a, b = tokenizer.encode("alice found").ids, tokenizer.encode("bob found").ids
    v = tokenizer.get_vocab_size()
    ordered = [v, *a, v + 1, *b, v + 2]
    assert data.train[0]["sequences"] == ([ordered, [v, *b, v + 1, *a, v + 2]] if both_orders else [ordered])


def test_a_tokenizer_that_does_not_match_the_model_is_refused(tmp_path):
    tokenizer = _tokenizer(tmp_path / "tok")
    data = load_task_data(OmegaConf.create(STSB), _write_pairs(tmp_path / "stsb"), tokenizer, 32, 32, None, 0)
    with pytest.raises(ValueError, match="pretrain them together"):
        data.make_model(gpt_config("gpt_tiny", vocab_size=tokenizer.get_vocab_size() + 1, n_positions=32))


def test_the_tagger_learns_tags_that_need_the_word_and_the_token_after_it():
    """Each word is two tokens; its tag is its last token's class and whether another word follows (as B/M/E/S needs
    the next character). Read at its last token and the one after, a random-init tagger learns it in 150 steps."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from data_prep.tasks.conll import TaggedSentence
    from models.gpt import GPTForTokenClassification
    from pipeline.downstream.modules import collate_token_classification
    from pipeline.gpt.downstream import tagging_features

    syllables = [f"s{i}" for i in range(12)]
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{s: i + 1 for i, s in enumerate(syllables)}}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("-", "removed")  # "s1-s7": a word of two tokens
    labels = ["a", "b", "a_end", "b_end"]
    rng = random.Random(0)

    def sentence():
        words = [f"{rng.choice(syllables)}-{rng.choice(syllables)}" for _ in range(rng.randint(2, 6))]
        tags = ["ab"[int(w.split("-")[1][1:]) % 2] + ("_end" if i == len(words) - 1 else "") for i, w in
                enumerate(words)]
        return TaggedSentence(words, tags)

    train, dev = ([sentence() for _ in range(n)] for n in (400, 100))
    end_id = len(syllables) + 1
    features = tagging_features(tokenizer, train, labels, 32, end_id)
    torch.manual_seed(0)
    model = GPTForTokenClassification(gpt_config("gpt_tiny", vocab_size=end_id + 1, n_positions=32, n_embd=32,
                                                 n_head=2), len(labels))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        batch = collate_token_classification(rng.sample(features, 32))
        loss = F.cross_entropy(model(batch["input_ids"]).flatten(0, 1), batch["labels"].flatten(),
                               ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    batch = collate_token_classification(tagging_features(tokenizer, dev, labels, 32, end_id))
    with torch.no_grad():
        predicted = model(batch["input_ids"]).argmax(-1)
    scored = batch["labels"] != IGNORE_INDEX
    assert scored.sum() == sum(len(s.tokens) for s in dev)  # every word tagged once
    assert (predicted[scored] == batch["labels"][scored]).float().mean() >= 0.95
