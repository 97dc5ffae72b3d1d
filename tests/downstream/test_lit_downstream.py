"""Each downstream module trains a tiny random BERT a few dozen steps on synthetic data: the loss must fall and dev
scores must come out of its epoch-end evaluation."""
import random

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from data_prep.corpus.tokenizer import train_wordpiece
from data_prep.tasks.conll import TaggedSentence, encode_tagged_sentences
from data_prep.tasks.squad import SquadExample, squad_features
from models.bert import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from pipeline.downstream.modules import (
    ClassificationModule,
    QuestionAnsweringModule,
    RegressionModule,
    TokenClassificationModule,
    collate_question_answering,
    collate_token_classification,
)

NAMES = ["peter", "mary", "john", "anna"]
CITIES = ["paris", "rome", "lima", "oslo"]
FILLER = ["the", "man", "went", "to", "see", "a", "house", "and", "then", "walked", "home", "slowly"]
OPTIMISER = dict(lr=3e-3, weight_decay=0.01, warmup_steps=2)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = random.Random(0)
    words = NAMES + CITIES + FILLER + ["where", "?"]
    corpus = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(300)]
    return train_wordpiece(corpus, tmp_path_factory.mktemp("tok"), vocab_size=100, min_frequency=1)


def tiny_config(vocab_size: int) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)


def fit(module, train_loader, dev_loader, max_steps: int) -> None:
    trainer = L.Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        check_val_every_n_epoch=1000)
    trainer.fit(module, train_loader, dev_loader)  # validation runs once, below, after training
    trainer.validate(module, dev_loader, verbose=False)


@torch.no_grad()
def mean_loss(module, loader) -> float:
    module.eval()
    losses = [module.model_step(batch)[0].item() for batch in loader]
    module.train()
    return sum(losses) / len(losses)


def tagged_sentences(n: int, seed: int) -> list[TaggedSentence]:
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(4, 8))]
        at = rng.randrange(len(words))
        words[at] = rng.choice(NAMES)
        sentences.append(TaggedSentence(words, ["B-PER" if w in NAMES else "O" for w in words]))
    return sentences


def test_token_classification_module_learns_and_scores_entities(tokenizer):
    L.seed_everything(0)
    labels = ["O", "B-PER", "I-PER"]
    train, dev = tagged_sentences(64, seed=1), tagged_sentences(16, seed=2)
    train_loader = DataLoader(encode_tagged_sentences(tokenizer, train, labels, 16), batch_size=16, shuffle=True,
                              collate_fn=collate_token_classification)
    dev_loader = DataLoader(encode_tagged_sentences(tokenizer, dev, labels, 16), batch_size=8,
                            collate_fn=collate_token_classification)
    model = BertForTokenClassification(tiny_config(tokenizer.get_vocab_size()), num_labels=len(labels))
    module = TokenClassificationModule(model, labels, [s.tags for s in dev], total_steps=40, **OPTIMISER)
    before = mean_loss(module, dev_loader)
    fit(module, train_loader, dev_loader, max_steps=40)
    assert mean_loss(module, dev_loader) < 0.5 * before
    assert set(module.scores) == {"precision", "recall", "f1"}
    assert module.scores["f1"] > 0.5


def qa_examples(n: int, seed: int) -> list[SquadExample]:
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(8, 16))]
        city = rng.choice(CITIES)
        at = rng.randrange(len(words))
        context = " ".join(words[:at] + [city] + words[at:])
        start = len(" ".join(words[:at] + [""])) if at else 0
        examples.append(SquadExample(f"q{seed}-{i}", "where ?", context, [city], [start]))
    return examples


def test_question_answering_module_learns_and_scores_answers(tokenizer):
    L.seed_everything(0)
    train, dev = qa_examples(64, seed=1), qa_examples(16, seed=2)
    windows = dict(max_seq_length=16, doc_stride=6, max_query_length=8)
    train_features = squad_features(tokenizer, train, **windows)
    dev_features = squad_features(tokenizer, dev, **windows)
    assert len(dev_features) > len(dev)  # long contexts are split into several windows
    train_loader = DataLoader(list(enumerate(train_features)), batch_size=16, shuffle=True,
                              collate_fn=collate_question_answering)
    dev_loader = DataLoader(list(enumerate(dev_features)), batch_size=8, collate_fn=collate_question_answering)
    model = BertForQuestionAnswering(tiny_config(tokenizer.get_vocab_size()))
    module = QuestionAnsweringModule(model, dev, dev_features, n_best_size=5, max_answer_length=4,
                                     total_steps=60, **OPTIMISER)
    before = mean_loss(module, dev_loader)
    fit(module, train_loader, dev_loader, max_steps=60)
    assert mean_loss(module, dev_loader) < 0.5 * before
    assert set(module.scores) == {"exact_match", "f1"}
    assert module.scores["exact_match"] > 0.5


def regression_batches(n_batches: int, seed: int) -> list[dict]:
    """The score is the fraction of tokens from the upper half of the vocabulary, times 5: a sentence-level
    signal for the [CLS] head."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        input_ids = torch.randint(5, 22, (16, 10), generator=generator)
        upper = torch.rand(16, 10, generator=generator) < torch.rand(16, 1, generator=generator)
        input_ids[upper] += 18
        batches.append({"input_ids": input_ids, "token_type_ids": torch.zeros_like(input_ids),
                        "attention_mask": torch.ones_like(input_ids), "labels": upper.float().mean(-1) * 5.0})
    return batches


def test_regression_module_learns_and_scores_correlations():
    L.seed_everything(0)
    train_loader = DataLoader(regression_batches(8, seed=1), batch_size=None, shuffle=True)
    dev_loader = DataLoader(regression_batches(2, seed=2), batch_size=None)
    model = BertForSequenceClassification(tiny_config(40), num_labels=1)
    module = RegressionModule(model, total_steps=80, **OPTIMISER)
    before = mean_loss(module, dev_loader)
    fit(module, train_loader, dev_loader, max_steps=80)
    assert mean_loss(module, dev_loader) < 0.5 * before
    assert set(module.scores) == {"pearson", "spearman"}
    assert module.scores["pearson"] > 0.5


def test_regression_module_refuses_integer_labels():
    module = RegressionModule(BertForSequenceClassification(tiny_config(40), num_labels=1), total_steps=1,
                              **OPTIMISER)
    batch = regression_batches(1, seed=0)[0]
    batch["labels"] = batch["labels"].long()
    with pytest.raises(TypeError, match="collate them as float"):
        module.model_step(batch)


def test_encoder_lr_factor_slows_exactly_the_task_models_encoder():
    """finetune.encoder_lr_factor reaches the encoder through the task model's `encoder`, not a family's name for it."""
    model = BertForSequenceClassification(tiny_config(50), 3)
    module = ClassificationModule(model, "accuracy", total_steps=10, **OPTIMISER)
    module.encoder_lr_factor = 0.1
    groups = module.configure_optimizers()["optimizer"].param_groups
    slow = {id(p) for g in groups if g["initial_lr"] == pytest.approx(0.1 * OPTIMISER["lr"]) for p in g["params"]}
    assert slow == {id(p) for p in model.bert.parameters()}
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in model.parameters()}
