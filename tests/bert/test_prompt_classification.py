"""finetune.pooling=prompt: prompt-based fine-tuning (PET, LM-BFF). The classifier is the masked-LM head read at the
template's [MASK] for the task's label words: its scores start as pretraining left them, the template survives any
sentence length, and a task without a prompt is refused with what to add."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file

import pipeline.bert.downstream as bert_downstream
from data_prep.corpus.tokenizer import encode_batch_ids, train_wordpiece
from models.bert import BertConfig, BertForPreTraining, BertForPromptClassification, save_pretrained
from pipeline.bert.data import pad_classification_batch, prompt_ids
from pipeline.bert.pretrain import HEADS_FILE
from pipeline.downstream.tasks import load_task
from pipeline.runner import validate
from tests.helpers import tiny_config

WORDS = "the film was good bad great awful plot actors a it fun dull long short and but not very".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    sentences = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5
    return train_wordpiece(sentences, tmp_path_factory.mktemp("tok"), vocab_size=120, min_frequency=1)


def _task(**prompt) -> OmegaConf:
    return OmegaConf.create({"name": "toy", "format": "tsv", "text_a": "sentence", "text_b": None,
                             "labels": ["0", "1"], "metric": "accuracy", **prompt})


def test_the_template_and_its_mask_survive_a_text_longer_than_max_seq_length(tokenizer):
    template = "a [MASK] film . {text}"
    long_text, short_text = " ".join(WORDS * 4), "the plot was fun"
    rows = prompt_ids(tokenizer, template, [long_text, short_text], max_seq_length=16)
    mask = tokenizer.token_to_id("[MASK]")
    assert len(rows[0]) == 16 and rows[0].count(mask) == 1 and rows[0][:3] == [tokenizer.token_to_id("[CLS]"),
                                                                               *encode_batch_ids(tokenizer, ["a"])[0],
                                                                               mask]
    # unabridged, the ids are those of the whole filled-in template
    whole = tokenizer.encode("a [MASK] film . the plot was fun").ids
    assert rows[1] == whole
    with pytest.raises(ValueError, match="no room"):
        prompt_ids(tokenizer, "a long long long long [MASK] film . {text}", [short_text], max_seq_length=8)
    with pytest.raises(ValueError, match=r"\{text\} and \[MASK\] once"):
        prompt_ids(tokenizer, "{text} it was good .", [short_text], max_seq_length=16)


def test_the_classifier_scores_are_the_pretraining_heads_label_word_logits(tmp_path, tokenizer):
    config = BertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    pretraining = BertForPreTraining(config).eval()
    with torch.no_grad():
        pretraining.cls.predictions.bias.normal_()  # a head unlike a fresh one
    save_pretrained(pretraining.bert, tmp_path / "stage" / "encoder")
    save_file(pretraining.heads_state_dict(), str(tmp_path / "stage" / HEADS_FILE))
    task = _task(prompt_template="{text} it was [MASK] .", prompt_label_words=["bad", "good"])
    template, word_ids = bert_downstream.prompt_of(task, tokenizer)
    assert word_ids == [tokenizer.token_to_id("bad"), tokenizer.token_to_id("good")]

    models = bert_downstream.BertTaskModels(tmp_path / "stage" / "encoder", tokenizer, "tok", dropout=0.0,
                                            pooling="prompt")
    data = bert_downstream.TaskData([], [], None, lambda c: BertForPromptClassification(
        c, word_ids, tokenizer.token_to_id("[MASK]")), None, None)
    model = models.build(data).eval()
    batch = pad_classification_batch([{"input_ids": ids, "token_type_ids": [0] * len(ids), "label": 0}
                                      for ids in prompt_ids(tokenizer, template, ["the plot was fun", "dull"], 16)])
    scores = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    vocab_scores, _ = pretraining(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])[:2]
    at_mask = vocab_scores[batch["input_ids"] == tokenizer.token_to_id("[MASK]")]  # (B, V)
    torch.testing.assert_close(scores, at_mask[:, word_ids])
    # the random twin starts from a fresh head, not the pretrained one
    twin = bert_downstream.BertTaskModels(tmp_path / "stage" / "encoder", tokenizer, "tok", pretrained=False,
                                          dropout=0.0, pooling="prompt").build(data).eval()
    assert not torch.allclose(twin(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]), scores)


def test_an_encoder_without_its_pretraining_head_is_refused_with_the_poolings_that_work(tmp_path, tokenizer):
    config = BertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    save_pretrained(BertForPreTraining(config).bert, tmp_path / "hf_like" / "encoder")
    models = bert_downstream.BertTaskModels(tmp_path / "hf_like" / "encoder", tokenizer, "tok", pooling="prompt")
    data = bert_downstream.TaskData([], [], None, lambda c: BertForPromptClassification(c, [5, 6], 4), None, None)
    with pytest.raises(FileNotFoundError, match="pooling=mean or cls"):
        models.build(data)


@pytest.mark.parametrize("task, message", [
    (_task(), "needs prompt_template"),
    (_task(prompt_template="a [MASK] film . {text}", prompt_label_words=["bad"]), "one word per label"),
    (_task(prompt_template="a [MASK] film . {text}", prompt_label_words=["bad", "zzzgood"]), "not one piece"),
    (_task(text_b="sentence2", prompt_template="a [MASK] . {text}", prompt_label_words=["bad", "good"]), "pairs"),
])
def test_a_task_without_a_usable_prompt_is_refused_with_what_to_add(tokenizer, task, message):
    with pytest.raises(ValueError, match=message):
        bert_downstream.prompt_of(task, tokenizer)


def test_the_built_in_sentiment_task_has_a_prompt_whose_words_follow_its_labels():
    task = load_task("rotten_tomatoes")
    assert list(task.labels) == ["0", "1"] and list(task.prompt_label_words) == ["bad", "good"]
    assert task.prompt_template.count("[MASK]") == 1 and "{text}" in task.prompt_template


def test_a_run_whose_task_has_no_prompt_is_refused_before_pretraining(tmp_path):
    validate(tiny_config(tmp_path, ["finetune.pooling=prompt", "finetune.task=rotten_tomatoes"]))
    with pytest.raises(ValueError, match="sst2: finetune.pooling=prompt needs prompt_template"):
        validate(tiny_config(tmp_path, ["finetune.pooling=prompt", "finetune.task=sst2"]))
    validate(tiny_config(tmp_path, ["finetune.pooling=mean", "finetune.task=sst2"]))  # the usual pooling: no prompt
