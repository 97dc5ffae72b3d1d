"""ELMo: data functions, biLM, scalar mix, downstream heads, and a short pretraining run whose held-out perplexity
falls. Corpora are written by the tests themselves."""
from __future__ import annotations

import os
import random
import socket
from collections import Counter
from pathlib import Path

import hydra
import lightning as L
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from conventions.elmo_words import BOS, EOS, UNK, UNK_ID
from data_prep.corpus.word_vectors import WordVectors
from data_prep.examples.elmo_examples import (
    SPECIAL_WORDS,
    TokenStreams,
    books_from_rows,
    build_word_vocab,
    plan_windows,
    read_word_vocab,
    split_books,
    write_token_streams,
    write_word_vocab,
)
from models import IGNORE_INDEX
from models.elmo import (
    MAX_CHARACTERS_PER_TOKEN,
    BiLanguageModel,
    ElmoEmbedder,
    ElmoSentenceClassifier,
    ElmoTokenTagger,
    MixSettings,
    ProjectedLSTM,
    ScalarMix,
    elmo_config,
    load_pretrained,
    save_pretrained,
    sentence_batch_inputs,
    word_char_ids,
)
from pipeline import CONF_DIR
from pipeline.downstream.finetune import controls_in_run, finetune_kinds, finetune_settings
from pipeline.downstream.tasks import load_task
from pipeline.downstream.word2vec import VECTORS_FILE, WORDS_FILE
from pipeline.elmo.data import LMWindowBatches, build_elmo_datasets
from pipeline.elmo.downstream import FINETUNE_KINDS, ElmoTaskModule, make_elmo_task_collate, vocab_vectors
from pipeline.elmo.module import ElmoPretrainModule
from pipeline.engine.dag import StageContext, plan
from pipeline.runner import validate
from pipeline.stages import STAGES
from tests.helpers import ENDINGS, OBJECTS, SUBJECTS, VERBS, family_config, optimizer_settings, tiny_config

# elmo_small's architecture at a size that trains in seconds.
TINY = dict(filters=[[1, 8], [2, 8], [3, 16]], projection_dim=16, lstm_dim=32, dropout=0.0)


def tiny_bilm(vocab_size: int = 50, **overrides) -> BiLanguageModel:
    torch.manual_seed(0)
    return BiLanguageModel(elmo_config("elmo_small", vocab_size=vocab_size, **{**TINY, **overrides})).eval()


@pytest.mark.parametrize("use_state", [True, False])
def test_projected_lstm_equals_nn_lstm_with_its_weights(use_state):
    """Outputs, final state and every gradient (input, initial state, five weights) equal nn.LSTM(proj_size)'s."""
    torch.manual_seed(0)
    reference = torch.nn.LSTM(6, 10, proj_size=4, batch_first=True).double()
    ours = ProjectedLSTM(6, 10, 4).double()
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(3, 5, 6, dtype=torch.double, requires_grad=True)
    state = (torch.randn(1, 3, 4, dtype=torch.double, requires_grad=True),
             torch.randn(1, 3, 10, dtype=torch.double, requires_grad=True))
    weights = torch.randn(3, 5, 4, dtype=torch.double)
    results = []
    for lstm in (reference, ours):
        out, (h, c) = lstm(x, state)
        loss = (out * weights).sum() + ((h * 1.3).sum() + (c * 0.7).sum() if use_state else 0)
        results.append((out, h, c, torch.autograd.grad(loss, [x, *state, *lstm.parameters()])))
    torch.testing.assert_close(results[0], results[1])


def test_projected_lstm_runs_under_bf16_autocast():
    lstm = ProjectedLSTM(8, 16, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = lstm(torch.randn(2, 3, 8))
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and lstm.weight_hh_l0.grad.dtype == torch.float32
    assert lstm.weight_hh_l0.grad.abs().sum() > 0


def write_streams(tmp_path: Path, n_books: int = 6, sentences: int = 40, seed: int = 0) -> tuple[Path, list[str]]:
    """Sentence rows ordered by book, as the shards hold them, turned into one stream file and a vocabulary."""
    rng = random.Random(seed)
    book_ids, texts = [], []
    for b in range(n_books):
        for _ in range(sentences):
            book_ids.append(f"book-{b}")
            texts.append(f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                         f"{rng.choice(ENDINGS)}.")
    path = tmp_path / "streams-00000.arrow"
    assert write_token_streams(books_from_rows(book_ids, texts), path) == n_books
    return path, build_word_vocab(texts, max_size=200, min_count=1)


# -----------------------------------------------------------------------------
# Data functions


def test_vocabulary_counted_per_shard_equals_the_one_counted_over_the_whole_corpus(tmp_path):
    import pyarrow as pa

    from data_prep.examples.elmo_examples import count_words, vocab_from_counts
    from pipeline.corpus import count_shard_texts

    shards = [["b a b, c", "b a d"], ["d d e", "a"], ["e, b"]]
    counts = Counter()
    for i, texts in enumerate(shards):
        path = tmp_path / f"shard-{i:05d}.arrow"
        with pa.ipc.new_file(str(path), pa.schema([("text", pa.string())])) as writer:
            writer.write_table(pa.table({"text": texts}))
        counts.update(count_shard_texts(i, path, count_words))  # each shard task's count
    everything = [t for texts in shards for t in texts]
    for max_size, min_count in ((6, 1), (20, 1), (20, 2)):
        assert vocab_from_counts(counts, max_size, min_count) == build_word_vocab(everything, max_size, min_count)
    assert vocab_from_counts(counts, 20, 1)[3:6] == ["b", "a", "d"]  # b: 4, a: 3, d: 3 (a before d on the tie)


def test_word_vocab_is_specials_then_words_by_frequency(tmp_path):
    vocab = build_word_vocab(["b a b, c", "b a d"], max_size=6, min_count=1)
    assert vocab == [BOS, EOS, UNK, "b", "a", ","]  # b: 3, a: 2, then ties alphabetically, cut at max_size
    assert build_word_vocab(["b a b, c", "b a d"], max_size=10, min_count=2) == [BOS, EOS, UNK, "b", "a"]
    write_word_vocab(vocab, tmp_path / "vocab.txt")
    assert read_word_vocab(tmp_path / "vocab.txt") == vocab
    (tmp_path / "bad.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match="build_word_vocab"):
        read_word_vocab(tmp_path / "bad.txt")


def test_char_ids_cut_long_words_and_mark_sentence_boundaries():
    long_word = "x" * 80
    ids = word_char_ids(long_word)
    assert len(ids) == MAX_CHARACTERS_PER_TOKEN
    assert ids[0] == 259 and ids[-1] == 260  # begin-of-word, 48 bytes, end-of-word (bilm-tf ids + 1)
    assert word_char_ids(long_word) == word_char_ids("x" * 48)
    assert word_char_ids("é")[:4] == (259, 0xC3 + 1, 0xA9 + 1, 260)  # UTF-8 bytes
    assert word_char_ids(BOS)[:3] == (259, 257, 260) and word_char_ids(EOS)[:3] == (259, 258, 260)


def test_stream_files_round_trip_with_sentence_boundaries(tmp_path):
    path = tmp_path / "s.arrow"
    write_token_streams(books_from_rows(["a", "a", "b"], ["Hi there.", "Go", "End"]), path)
    streams = TokenStreams([path])
    assert streams.book_ids == ["a", "b"]
    assert streams.tokens(0) == [BOS, "Hi", "there", ".", EOS, BOS, "Go", EOS]
    assert streams.lengths.tolist() == [8, 3]


def test_window_plan_covers_every_pair_once_and_resets_exactly_at_new_books():
    lengths = [5, 3, 9, 1]  # a one-token book has no (input, next token) pair and is skipped
    steps = list(plan_windows(lengths, batch_size=2, window=3))
    covered = {b: [] for b in range(len(lengths))}
    for slots in steps:
        for slot in slots:
            if slot is not None:
                assert slot.reset == (slot.start == 0)
                covered[slot.book].extend(range(slot.start, slot.start + slot.length))
    assert covered == {0: [0, 1, 2, 3], 1: [0, 1], 2: list(range(8)), 3: []}
    # row 1 finishes book 1 first and takes book 2; row 0 idles once book 0 is done and no book is left
    rows = [[(s.book, s.start, s.reset) if s else None for s in step] for step in steps]
    assert rows == [[(0, 0, True), (1, 0, True)], [(0, 3, False), (2, 0, True)], [None, (2, 3, False)],
                    [None, (2, 6, False)]]


def test_window_batches_carry_rows_within_a_book_and_reverse_it_for_the_backward_lm(tmp_path):
    path = tmp_path / "s.arrow"
    write_token_streams(books_from_rows(["a", "a", "b"], ["w1 w2 w3", "w4 w5", "v1"]), path)
    vocab = [BOS, EOS, UNK, "w1", "w2", "w3", "w4", "w5", "v1"]
    batches = list(LMWindowBatches(TokenStreams([path]), [0, 1], vocab, batch_size=1, window=4, char_inputs=False))
    # book a = <S> w1 w2 w3 </S> <S> w4 w5 </S> (9 tokens, 8 pairs, 2 windows), then book b (3 tokens, 1 window)
    assert [b["reset"].tolist() for b in batches] == [[True], [False], [True]]
    assert batches[0]["forward_inputs"].tolist() == [[0, 3, 4, 5]]
    assert batches[0]["forward_targets"].tolist() == [[3, 4, 5, 1]]
    assert batches[0]["backward_inputs"].tolist() == [[1, 7, 6, 0]]  # </S> w5 w4 <S>: book a read from its end
    assert batches[0]["backward_targets"].tolist() == [[7, 6, 0, 1]]
    assert batches[2]["forward_targets"].tolist() == [[8, 1, IGNORE_INDEX, IGNORE_INDEX]]


def test_split_books_holds_out_whole_books():
    train, heldout = split_books(10, 0.2, 5, np.random.default_rng(0))
    assert len(heldout) == 2 and sorted(train + heldout) == list(range(10))
    with pytest.raises(ValueError, match="at least 2 books"):
        split_books(1, 0.5, 5, np.random.default_rng(0))


# -----------------------------------------------------------------------------
# Model


def test_scalar_mix_weights_normalise_and_gradients_reach_s_and_gamma():
    torch.manual_seed(0)
    for do_layer_norm in (False, True):
        mix = ScalarMix(3, do_layer_norm=do_layer_norm)
        with torch.no_grad():
            mix.scalar_parameters.copy_(torch.tensor([0.5, -1.0, 2.0]))
            mix.gamma.fill_(1.5)
        assert torch.allclose(mix.weights().sum(), torch.tensor(1.0))
        layers, mask = torch.randn(2, 3, 4, 6), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
        out = mix(layers, mask)
        if not do_layer_norm:
            expected = 1.5 * sum(w * layers[:, j] for j, w in enumerate(torch.softmax(mix.scalar_parameters, 0)))
            assert torch.allclose(out, expected, atol=1e-6)
        (out * torch.randn_like(out)).sum().backward()
        assert mix.scalar_parameters.grad.abs().min() > 0 and mix.gamma.grad.abs() > 0


def test_each_direction_sees_only_its_own_past():
    """Perturbing word j moves forward states at positions >= j and backward states at positions <= j only."""
    bilm = tiny_bilm()
    embedder = ElmoEmbedder(bilm)
    sentences = ["the old man saw a ship at night", "a short one"]
    changed = ["the old man saw THE ship at night", "a short one"]
    (reps, mask), (reps2, _) = embedder.embed(sentences), embedder.embed(changed)
    P, j = bilm.config.projection_dim, 4
    contextual = (reps - reps2)[0, 1:].abs()  # (L, T, 2P): the biLSTM layers of sentence 0
    forward_diff, backward_diff = contextual[..., :P].amax(-1), contextual[..., P:].amax(-1)  # (L, T) each
    assert contextual.shape[1] == int(mask[0].sum()) == 8
    assert forward_diff[:, :j].max() == 0 and forward_diff[:, j:].min() > 0
    assert backward_diff[:, j + 1:].max() == 0 and backward_diff[:, :j + 1].min() > 0
    assert torch.equal(reps[1], reps2[1])  # rows do not mix


def test_backward_lm_ignores_padding_after_short_sentences():
    embedder = ElmoEmbedder(tiny_bilm())
    alone, _ = embedder.embed(["a short one"])
    padded, mask = embedder.embed(["a short one", "a much longer sentence than the first one"])
    assert torch.allclose(alone[0], padded[0, :, : alone.shape[2]], atol=1e-6)
    assert padded[0, :, alone.shape[2]:].abs().max() == 0


def test_char_cnn_handles_overlong_words_and_empty_sentences():
    bilm = tiny_bilm()
    embedder = ElmoEmbedder(bilm)
    reps, mask = embedder.embed(["", "a " + "supercalifragilistic" * 5, ""])
    assert reps.shape == (3, 3, 2, 2 * bilm.config.projection_dim) and mask.sum(1).tolist() == [0, 2, 0]
    assert torch.isfinite(reps).all() and reps[0].abs().max() == 0
    empty, empty_mask = embedder.embed([""])
    assert empty.shape == (1, 3, 0, 32) and empty_mask.shape == (1, 0)
    assert bilm.token_encoder(torch.zeros(2, 0, MAX_CHARACTERS_PER_TOKEN, dtype=torch.long)).shape == (2, 0, 16)


def test_reset_rows_start_from_a_zero_state_and_other_rows_carry_theirs():
    bilm = tiny_bilm()
    gen = torch.Generator().manual_seed(0)
    windows = [(torch.randint(1, 262, (2, 4, MAX_CHARACTERS_PER_TOKEN), generator=gen),
                torch.randint(1, 262, (2, 4, MAX_CHARACTERS_PER_TOKEN), generator=gen),
                torch.randint(0, 50, (2, 4), generator=gen), torch.randint(0, 50, (2, 4), generator=gen))
               for _ in range(2)]
    first = bilm(*windows[0])
    carried = bilm(*windows[1], state=first.state, reset=torch.tensor([True, False]))
    fresh = bilm(*windows[1])
    (carried_f, _), (carried_b, _) = carried.state[0][-1], carried.state[1][-1]
    (fresh_f, _), (fresh_b, _) = fresh.state[0][-1], fresh.state[1][-1]
    assert torch.allclose(carried_f[:, 0], fresh_f[:, 0]) and torch.allclose(carried_b[:, 0], fresh_b[:, 0])
    assert not torch.allclose(carried_f[:, 1], fresh_f[:, 1])


@pytest.mark.parametrize("softmax", ["full", "adaptive", "sampled"])
def test_softmax_options_give_finite_losses_and_exact_eval_nll(softmax):
    bilm = tiny_bilm(vocab_size=400, softmax=softmax, num_samples=64, adaptive_cutoffs=[20, 100])
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randint(1, 262, (2, 3, 5, MAX_CHARACTERS_PER_TOKEN), generator=gen)
    targets = torch.randint(0, 400, (2, 3, 5), generator=gen)
    targets[1, 0, 2:] = IGNORE_INDEX
    bilm.train()
    loss = bilm(inputs[0], inputs[1], targets[0], targets[1]).loss
    loss.backward()
    assert torch.isfinite(loss)
    bilm.eval()
    out = bilm(inputs[0], inputs[1], targets[0], targets[1])
    assert out.forward_tokens == 15 and out.backward_tokens == 12
    if softmax != "adaptive":  # eval scores the full softmax, sampled or not
        top = bilm.backward_lstm(bilm.token_encoder(inputs[1]), None)[0][-1].flatten(0, 1)
        keep = targets[1].flatten() != IGNORE_INDEX
        logits = top[keep] @ bilm.softmax.weight.T + bilm.softmax.bias
        expected = torch.nn.functional.cross_entropy(logits, targets[1].flatten()[keep], reduction="sum")
        assert torch.allclose(out.backward_nll_sum, expected, rtol=1e-5)


def test_word_input_bilm_and_checkpoint_round_trip(tmp_path):
    vocab = [BOS, EOS, UNK, "a", "short", "one"]
    bilm = tiny_bilm(vocab_size=len(vocab), token_encoder="word")
    with pytest.raises(ValueError, match="vocabulary"):
        ElmoEmbedder(bilm)
    inputs, mask = sentence_batch_inputs(["a short odd one"], {w: i for i, w in enumerate(vocab)})
    assert inputs.tolist() == [[0, 3, 4, UNK_ID, 5, 1]] and mask.all()
    save_pretrained(bilm, tmp_path / "bilm")
    loaded = load_pretrained(tmp_path / "bilm").eval()
    a, _ = ElmoEmbedder(bilm, vocab).embed(["a short one"])
    b, _ = ElmoEmbedder(loaded, vocab).embed(["a short one"])
    assert torch.equal(a, b)


@pytest.mark.parametrize("pair", [False, True])
def test_downstream_models_train_only_the_mix_and_the_head(pair):
    bilm = tiny_bilm()
    frozen = {k: v.clone() for k, v in bilm.state_dict().items()}
    model = ElmoSentenceClassifier(bilm, num_labels=2, hidden_size=8, pair=pair)
    collate = make_elmo_task_collate(model.features.embedder)
    rows = [{"text_a": "a good film", "label": 1}, {"text_a": "", "label": 0}]
    if pair:
        for r in rows:
            r["text_b"] = "another sentence"
    assert model.encoder is bilm  # the pretrained encoder, by the name every family's task model gives it
    module = ElmoTaskModule(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, total_steps=10)
    module.encoder_lr_factor = 0.1  # a frozen encoder stays frozen whatever its learning rate
    optimizer = module.configure_optimizers()["optimizer"]
    model.train()
    loss, predictions = module.model_step(collate(rows))
    loss.backward()
    assert model.features.mix.scalar_parameters.grad.abs().sum() > 0 and model.features.mix.gamma.grad != 0
    assert all(p.grad is None for p in bilm.parameters()) and predictions.shape == (2,)
    optimizer.step()
    assert all(torch.equal(v, frozen[k]) for k, v in bilm.state_dict().items())
    assert not model.features.embedder.training  # no dropout inside the frozen biLM


def write_finetune_inputs(tmp_path: Path, vocab: list[str], words: list[str],
                          overrides: tuple[str, ...] = ()) -> StageContext:
    """The stages ELMo's fine-tune kinds read, in `tmp_path`: elmo_pretrain's tiny biLM over `vocab`, elmo_vocab, and
    a word2vec output with a 4-d vector for each of `words` (row i all i + 1); the finetune stage's context over them,
    at elmo_small's settings and `overrides`."""
    save_pretrained(tiny_bilm(vocab_size=len(vocab)), tmp_path / "elmo_pretrain" / "bilm")
    (tmp_path / "elmo_vocab").mkdir()
    write_word_vocab(vocab, tmp_path / "elmo_vocab" / "vocab.txt")
    (tmp_path / "word2vec").mkdir()
    (tmp_path / "word2vec" / WORDS_FILE).write_text("\n".join(words), encoding="utf-8")
    np.save(tmp_path / "word2vec" / VECTORS_FILE, np.arange(1, len(words) + 1, dtype=np.float32)[:, None].repeat(4, 1))
    cfg = tiny_config(tmp_path, ["finetune.elmo_dropout=0.2", *overrides], experiment="elmo_small")
    return StageContext(cfg, "finetune", tmp_path / "finetune",
                        {name: tmp_path / name for name in ("elmo_pretrain", "elmo_vocab", "word2vec")})


@pytest.mark.parametrize(("kind", "rates"), [("elmo", [0.2, 0.2]), ("elmo_random", [0.2, 0.2]), ("elmo_w2v", [0.2])])
def test_finetune_elmo_dropout_is_the_dropout_of_every_rows_heads(tmp_path, kind, rates):
    """The paper's 0.5 kept the head from fitting 300 sentences
    (docs/history/pretraining_recipes_log.md, "Every family on the reviews"): the rate is a setting, read once where the
    fine-tune kind loads, and every dropout of the task model uses it."""
    ctx = write_finetune_inputs(tmp_path, [*SPECIAL_WORDS, "the", "found", "good", "bad"], ["the", "good"])
    models = FINETUNE_KINDS[kind].load(ctx)
    data = models.encode(load_task("rotten_tomatoes"), tmp_path / "task", finetune_settings(ctx.cfg), 1, None)
    model = data.make_model(None)
    inside_bilm = {id(m) for m in model.encoder.modules()} if model.encoder is not None else set()
    assert [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout) and id(m) not in inside_bilm] == rates
    # on the mixed ELMo vectors (where there is a biLM) and in the classifier


@pytest.mark.parametrize("kind", ["elmo", "elmo_random"])
def test_finetune_mix_settings_reach_every_head_that_reads_a_bilm(tmp_path, kind):
    """finetune.elmo_gamma_init, elmo_layer_norm and elmo_mix_dropout set the mix of `elmo` and of its twin alike (the
    twin differs only in its biLM); the head's own dropout stays elmo_dropout."""
    ctx = write_finetune_inputs(tmp_path, [*SPECIAL_WORDS, "the", "good"], ["the", "good"], (
        "finetune.elmo_gamma_init=0", "finetune.elmo_layer_norm=true", "finetune.elmo_mix_dropout=0.3"))
    models = FINETUNE_KINDS[kind].load(ctx)
    model = models.build(models.encode(load_task("rotten_tomatoes"), tmp_path / "task", finetune_settings(ctx.cfg), 1,
                                       None))
    assert model.features.mix.gamma.item() == 0 and model.features.mix.do_layer_norm
    assert model.features.dropout.p == 0.3 and model.classifier[2].p == 0.2


@pytest.mark.parametrize("override", ["finetune.elmo_gamma_init=-0.5", "finetune.elmo_mix_dropout=1.0"])
def test_a_mix_setting_out_of_its_range_is_refused_before_any_stage(tmp_path, override):
    cfg = tiny_config(tmp_path, [override], experiment="elmo_small")
    with pytest.raises(ValueError, match=f"{override.split('=')[0]}=.*: expected"):
        validate(cfg)


def control_head_of(model: ElmoSentenceClassifier, word_vectors: torch.Tensor) -> ElmoSentenceClassifier:
    """The head of `model` without its biLM, the control: its weights, less the BiLSTM's input columns of the mix."""
    control = ElmoSentenceClassifier(None, num_labels=2, hidden_size=model.bilstm.lstm.hidden_size, dropout=0.0,
                                     word_vectors=word_vectors)
    d = word_vectors.shape[1]
    control.load_state_dict({key: value[:, :d] if ".weight_ih_" in key else value
                             for key, value in model.state_dict().items() if not key.startswith("features.")})
    return control.eval()


def test_a_mix_started_at_gamma_0_leaves_the_head_the_control_until_gamma_learns():
    """finetune.elmo_gamma_init=0: at step 0 the head's output is its control's, on the same vectors, whatever the
    biLM reads; only γ gets a gradient through the mix (the BiLSTM's columns of the mix none), and one step later the
    mix moves the output."""
    vocab = [*SPECIAL_WORDS, "a", "good", "film", "bad"]
    torch.manual_seed(0)
    word_vectors = torch.randn(len(vocab), 3)
    model = ElmoSentenceClassifier(tiny_bilm(vocab_size=len(vocab)), num_labels=2, hidden_size=8, vocab=vocab,
                                   dropout=0.0, word_vectors=word_vectors.clone(),
                                   mix=MixSettings(gamma_init=0.0, dropout=0.0))
    collate = make_elmo_task_collate(model.features.embedder, vocab)
    batch = collate([{"text_a": "a good film", "label": 1}, {"text_a": "a bad film", "label": 0}])
    other_bilm_inputs = collate([{"text_a": "bad bad bad", "label": 1}, {"text_a": "good good good", "label": 0}])

    def logits(head: ElmoSentenceClassifier, inputs: torch.Tensor | None) -> torch.Tensor:
        with torch.no_grad():
            return head(inputs, batch["mask"], word_ids=batch["word_ids"])

    model.eval()
    control = logits(control_head_of(model, word_vectors), None)
    assert torch.allclose(logits(model, batch["inputs"]), control, atol=1e-6)
    assert torch.allclose(logits(model, other_bilm_inputs["inputs"]), control, atol=1e-6)

    module = ElmoTaskModule(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, total_steps=10)
    optimizer = module.configure_optimizers()["optimizer"]
    model.train()
    module.model_step(batch)[0].backward()
    mix_columns = model.bilstm.lstm.weight_ih_l0.grad[:, word_vectors.shape[1]:]
    assert model.features.mix.gamma.grad != 0 and mix_columns.abs().sum() == 0
    optimizer.step()
    model.eval()
    assert model.features.mix.gamma.item() != 0
    assert not torch.allclose(logits(model, batch["inputs"]), logits(model, other_bilm_inputs["inputs"]))


def test_layer_norm_gives_each_layer_unit_variance_before_the_mix():
    """elmo_layer_norm: layers of scales 4.9, 0.6 and 0.9 (the small biLM's, docs/pretraining_recipes.md) each become
    zero-mean, unit-variance over their unmasked values, so the mix of three copies of one pattern at those scales is
    that pattern standardised, whatever the weights, and padding stays zero."""
    torch.manual_seed(0)
    pattern = torch.randn(2, 1, 5, 6)
    layers = torch.cat([4.9 * pattern + 2.0, 0.6 * pattern, 0.9 * pattern - 1.0], 1)  # (B, 3, T, D)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    layers = layers * mask[:, None, :, None]
    mix = ScalarMix(3, do_layer_norm=True)
    with torch.no_grad():
        mix.scalar_parameters.copy_(torch.tensor([0.3, -2.0, 1.0]))
        out = mix(layers, mask)  # (B, T, D)
    valid = out[mask]  # (words, D)
    assert abs(valid.mean().item()) < 1e-5 and abs(valid.var(unbiased=False).item() - 1) < 1e-4
    assert out[~mask].abs().sum() == 0
    expected = pattern[:, 0][mask]
    assert torch.allclose(valid, (expected - expected.mean()) / expected.std(unbiased=False), atol=1e-4)


def test_word_vectors_of_the_vocabulary_are_word2vec_s_rows_and_zeros_elsewhere():
    """Each word of the biLM's vocabulary gets its word2vec vector, looked up lower-cased as word2vec's words are
    (the biLM's keep case); a word word2vec lacks, and each special word, gets zeros."""
    vectors = WordVectors(("the", "good"), np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32))
    rows = vocab_vectors([*SPECIAL_WORDS, "good", "Good", "The", "unseen"], vectors)
    assert rows.tolist() == [[0, 0], [0, 0], [0, 0], [3, 4], [3, 4], [1, 2], [0, 0]]


@pytest.mark.parametrize("head", ["sentence", "pair", "tagger"])
def test_heads_read_frozen_word_vectors_beside_the_mix(head):
    """Peters et al. §3.3: the head's input is [word vector; ELMo], its width the vectors' and the mix's together;
    the vectors are the vocabulary's rows, and stay as they are while the head trains."""
    vocab = [*SPECIAL_WORDS, "a", "good", "film"]
    bilm = tiny_bilm(vocab_size=len(vocab))
    word_vectors = torch.arange(len(vocab) * 3, dtype=torch.float32).view(len(vocab), 3)
    if head == "tagger":
        model = ElmoTokenTagger(bilm, num_tags=2, hidden_size=8, vocab=vocab, word_vectors=word_vectors.clone())
        rows = [{"text_a": ["a", "good", "film"], "label": [0, 1, 0]}, {"text_a": ["unseen"], "label": [1]}]
    else:
        model = ElmoSentenceClassifier(bilm, num_labels=2, hidden_size=8, pair=head == "pair", vocab=vocab,
                                       word_vectors=word_vectors.clone())
        rows = [{"text_a": "a good film", "label": 1}, {"text_a": "unseen", "label": 0}]
        if head == "pair":
            for r in rows:
                r["text_b"] = "a film"
    assert model.input_dim == 3 + 2 * bilm.config.projection_dim == model.bilstm.lstm.input_size
    batch = make_elmo_task_collate(model.features.embedder, vocab)(rows)
    assert batch["word_ids"][0, 1:4].tolist() == [3, 4, 5] and batch["word_ids"][1, 1].item() == UNK_ID
    x, word_mask = model.word_representations(batch["inputs"], batch["word_ids"], batch["mask"])
    assert torch.equal(x[0, :3, :3], word_vectors[3:6]) and torch.equal(x[1, 0, :3], word_vectors[UNK_ID])
    module = ElmoTaskModule(model, lr=1e-1, weight_decay=0.0, warmup_steps=0, total_steps=10,
                            **({"metric": "entity_f1", "labels": ["O", "B-PER"]} if head == "tagger" else {}))
    optimizer = module.configure_optimizers()["optimizer"]
    model.train()
    module.model_step(batch)[0].backward()
    optimizer.step()
    assert not model.word_vectors.weight.requires_grad and torch.equal(model.word_vectors.weight, word_vectors)
    assert model.bilstm.lstm.weight_ih_l0.grad[:, :3].abs().sum() > 0  # the vectors reach the head


def test_the_control_reads_the_word_vectors_and_no_bilm(tmp_path):
    """elmo_w2v, `elmo`'s control: the same head on the word vectors alone, what the task model is without ELMo. It
    waits for no pretraining, and a different biLM leaves its logits as they were, where `elmo`'s change."""
    vocab = [*SPECIAL_WORDS, "the", "found", "good", "bad"]
    # γ at the paper's 1: from elmo_small's 0 the mix moves `elmo`'s logits only once γ has trained
    ctx = write_finetune_inputs(tmp_path, vocab, ["the", "good", "bad"], ("finetune.elmo_gamma_init=1",))
    assert FINETUNE_KINDS["elmo_w2v"].upstream(ctx.cfg) == ("elmo_vocab", "word2vec")
    assert FINETUNE_KINDS["elmo"].control(ctx.cfg) == "elmo_w2v"
    task = load_task("rotten_tomatoes")

    def logits(kind: str) -> torch.Tensor:
        models = FINETUNE_KINDS[kind].load(ctx)
        data = models.encode(task, tmp_path / "task", finetune_settings(ctx.cfg), 1, None)
        torch.manual_seed(0)
        model = models.build(data).eval()
        batch = data.collate([data.dev[i] for i in range(4)])
        with torch.no_grad():
            return model(batch.get("inputs"), batch["mask"], word_ids=batch["word_ids"])

    control = FINETUNE_KINDS["elmo_w2v"].load(ctx)
    model = control.build(control.encode(task, tmp_path / "task", finetune_settings(ctx.cfg), 1, None))
    assert model.encoder is None and not any(isinstance(m, BiLanguageModel) for m in model.modules())
    assert model.input_dim == 4
    before = {kind: logits(kind) for kind in ("elmo", "elmo_w2v")}
    other = tiny_bilm(vocab_size=len(vocab))
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    save_pretrained(other, tmp_path / "elmo_pretrain" / "bilm")
    assert torch.equal(logits("elmo_w2v"), before["elmo_w2v"])
    assert not torch.equal(logits("elmo"), before["elmo"])


def test_elmo_small_fine_tunes_elmo_beside_its_twin_and_its_control_which_waits_for_no_pretraining(tmp_path):
    """+experiment=elmo_small: `elmo` with its random twin and its control elmo_w2v (finetune.controls), the heads of
    both biLM kinds reading the word2vec stage beside the biLM, the control word2vec and the vocabulary alone; with
    finetune.elmo_word_vectors=none the twin is the control, and elmo_w2v is refused before any stage runs."""
    cfg = family_config(tmp_path, "elmo")
    kinds = finetune_kinds(cfg, finetune_settings(cfg))
    assert {name: kind.upstream(cfg) for name, kind in kinds.items()} == {
        "elmo": ("elmo_vocab", "elmo_pretrain", "word2vec"), "elmo_random": ("elmo_vocab", "elmo_pretrain", "word2vec"),
        "elmo_w2v": ("elmo_vocab", "word2vec")}
    assert controls_in_run(cfg, kinds) == {"elmo": "elmo_w2v"}
    assert {"elmo_vocab", "elmo_pretrain", "word2vec"} <= set(plan(cfg, STAGES).stages["finetune"].upstream)

    cfg = family_config(tmp_path, "elmo", ["finetune.elmo_word_vectors=none"])
    kinds = finetune_kinds(cfg, finetune_settings(cfg))
    assert {name: kind.upstream(cfg) for name, kind in kinds.items()} == {
        "elmo": ("elmo_vocab", "elmo_pretrain"), "elmo_random": ("elmo_vocab", "elmo_pretrain")}
    assert controls_in_run(cfg, kinds) == {"elmo": "elmo_random"}
    cfg.finetune.models = ["elmo", "elmo_w2v"]
    with pytest.raises(ValueError, match="finetune.models has elmo_w2v.*finetune.elmo_word_vectors=none"):
        validate(cfg)


def test_token_tagger_scores_only_labelled_words():
    model = ElmoTokenTagger(tiny_bilm(), num_tags=3, hidden_size=8)
    collate = make_elmo_task_collate(model.features.embedder)
    batch = collate([{"text_a": "a b c", "label": [0, 1, 2]}, {"text_a": "d", "label": [1]}])
    assert batch["labels"].tolist() == [[0, 1, 2], [1, IGNORE_INDEX, IGNORE_INDEX]]
    module = ElmoTaskModule(model, 1e-3, 0.0, 0, 10, metric="entity_f1", labels=["O", "B-PER", "I-PER"])
    loss, predictions = module.model_step(batch)
    assert torch.isfinite(loss) and predictions.shape == (2, 3)
    module.on_validation_epoch_start()
    module.validation_step(batch, 0)
    assert [len(tags) for tags in module._references] == [3, 1]  # padding words are not scored
    assert module._references[1] == ["B-PER"]


# -----------------------------------------------------------------------------
# Configs and training


def test_model_configs_instantiate_elmo_sizes():
    with initialize_config_dir(config_dir=str(CONF_DIR / "model"), version_base="1.3"):
        small = compose(config_name="elmo_small")
        original = compose(config_name="elmo_original")
    small.config.vocab_size = 100
    model = hydra.utils.instantiate(OmegaConf.to_container(small, resolve=True), _convert_="all")
    assert isinstance(model, BiLanguageModel) and model.config.lstm_dim == 512
    original.config.vocab_size = 793471
    config = hydra.utils.instantiate(OmegaConf.to_container(original.config, resolve=True), _convert_="all")
    assert (config.lstm_dim, config.projection_dim, config.num_filters, config.softmax) == (4096, 512, 2048, "sampled")


@pytest.fixture
def one_thread():
    """Tiny matmuls gain nothing from intra-op threads; on a busy shared CPU their spin-waits cost ~20x."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("softmax", ["full", "sampled"])
def test_pretraining_lowers_heldout_perplexity(tmp_path, one_thread, softmax):
    """Sampled: its sparse gradient goes through LazyAdamW and the sparse-aware clipping."""
    path, vocab = write_streams(tmp_path)
    train, val = build_elmo_datasets([path], vocab, window=10, batch_size=4, holdout_books_fraction=0.2,
                                     holdout_max_books=10, seed=0)
    assert len(val.books) == 1 and set(train.books).isdisjoint(val.books)
    L.seed_everything(0, verbose=False)
    model = BiLanguageModel(elmo_config("elmo_small", vocab_size=len(vocab), softmax=softmax,
                                        num_samples=len(vocab) // 2, **TINY))
    module = ElmoPretrainModule(model, optimizer_settings(1e-2, 5, 80))
    trainer = L.Trainer(max_steps=80, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                        num_sanity_val_steps=0, val_check_interval=80, check_val_every_n_epoch=None)
    val_loader = DataLoader(val, batch_size=None)
    trainer.validate(module, val_loader, verbose=False)
    before = dict(module.heldout_perplexities)
    trainer.fit(module, DataLoader(train, batch_size=None), val_loader)
    after = module.heldout_perplexities
    assert before["average"] > 0.6 * len(vocab)  # untrained: near uniform over the vocabulary
    assert after["forward"] < 0.3 * before["forward"] and after["backward"] < 0.3 * before["backward"]
    assert after["average"] == pytest.approx((after["forward"] + after["backward"]) / 2)


# -----------------------------------------------------------------------------
# Pretraining on the harness: resumable windows, ranks, distributed gradients


def test_window_batches_resume_at_a_batch_and_ranks_read_disjoint_books(tmp_path):
    path, vocab = write_streams(tmp_path, n_books=7)
    streams = TokenStreams([path])

    def batches(rank=0, world_size=1, start=0, n=30):
        data = LMWindowBatches(streams, range(7), vocab, batch_size=2, window=6, repeat=True, seed=3, rank=rank,
                               world_size=world_size)
        data.start = start
        return [b for _, b in zip(range(n), data)]

    every = batches()
    for resumed, expected in zip(batches(start=17, n=13), every[17:]):  # crosses into the second epoch
        assert all(torch.equal(resumed[k], expected[k]) for k in expected)
    ranks = [LMWindowBatches(streams, range(7), vocab, 2, 6, repeat=True, seed=3, rank=r, world_size=2)
             for r in (0, 1)]
    epoch_order = list(range(7))
    np.random.default_rng([3, 0]).shuffle(epoch_order)
    assert [epoch_order[r::2] for r in (0, 1)] == [epoch_order[0::2], epoch_order[1::2]]
    first_windows = [next(iter(r))["forward_targets"] for r in ranks]
    assert not torch.equal(first_windows[0], first_windows[1])
    with pytest.raises(ValueError, match="cannot be shared by 8 workers"):
        LMWindowBatches(streams, range(7), vocab, 2, 6, repeat=True, world_size=8)


def test_deepspeed_gets_a_dense_gradient_with_the_sparse_one_s_values():
    from pipeline.engine.optim import sparse_gradient_parameters, use_dense_gradients

    bilm = tiny_bilm(vocab_size=400, softmax="sampled", num_samples=64).train()
    assert sparse_gradient_parameters(bilm) == ["softmax.weight"]
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randint(1, 262, (2, 3, 5, MAX_CHARACTERS_PER_TOKEN), generator=gen)
    targets = torch.randint(0, 400, (2, 3, 5), generator=gen)
    grads = []
    for _ in range(2):
        torch.manual_seed(0)  # the same sampled candidates
        bilm.zero_grad(set_to_none=True)
        bilm(inputs[0], inputs[1], targets[0], targets[1]).loss.backward()
        grads.append(bilm.softmax.weight.grad)
        use_dense_gradients(bilm, "the test's")
    assert grads[0].is_sparse and not grads[1].is_sparse
    torch.testing.assert_close(grads[0].to_dense(), grads[1])
    assert sparse_gradient_parameters(bilm) == []


DDP_CLIP = 0.05  # below the gradient's norm: clipping acts, and must see the averaged gradient


def _elmo_step_module() -> ElmoPretrainModule:
    torch.manual_seed(0)
    model = BiLanguageModel(elmo_config("elmo_small", vocab_size=400, softmax="sampled", num_samples=64, **TINY))
    return ElmoPretrainModule(model, optimizer_settings(0.1, 1, 1))


def _one_step(module: ElmoPretrainModule, batch: dict, **trainer_args) -> None:
    trainer = L.Trainer(accelerator="cpu", max_steps=1, gradient_clip_val=DDP_CLIP, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, **trainer_args)
    torch.manual_seed(1)  # the sampled softmax's candidates: the same in every process
    trainer.fit(module, DataLoader([batch], batch_size=None, generator=torch.Generator()))


def _ddp_step(rank: int, port: int, batch: dict, out: str) -> None:
    """One DDP step on rank `rank`'s half of `batch`, in a process of its own (torch.multiprocessing.spawn)."""
    from lightning.pytorch.strategies import DDPStrategy

    from pipeline.engine.callbacks import SparseGradientSync

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", NODE_RANK="0",
                      LOCAL_RANK=str(rank), RANK=str(rank))  # launched here, not by Lightning
    torch.set_num_threads(1)
    module = _elmo_step_module()
    half = {k: v[2 * rank: 2 * rank + 2] for k, v in batch.items()}
    _one_step(module, half, devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
              callbacks=[SparseGradientSync(module)])
    if rank == 0:
        torch.save(_gradients(module), out)


def _gradients(module: ElmoPretrainModule) -> dict[str, torch.Tensor]:
    """The gradients the optimizer stepped with (averaged and clipped; Lightning leaves them after the last step),
    sparse ones as they came."""
    return {name: p.grad for name, p in module.named_parameters()}


@pytest.mark.slow  # two processes importing Lightning: ~20-30 s on 2 cores
def test_ddp_step_with_the_sampled_softmax_equals_one_process_on_the_whole_batch(tmp_path):
    """The sampled softmax's gradient is sparse, which DDP cannot reduce: SparseGradientSync averages it over gloo
    before clipping and LazyAdamW's step. Two ranks on two halves must step with the gradients one process has on
    both (no padding, so the mean loss of the whole batch is the mean of the halves' means)."""
    gen = torch.Generator().manual_seed(2)
    batch = {"forward_inputs": torch.randint(1, 262, (4, 5, MAX_CHARACTERS_PER_TOKEN), generator=gen),
             "backward_inputs": torch.randint(1, 262, (4, 5, MAX_CHARACTERS_PER_TOKEN), generator=gen),
             "forward_targets": torch.randint(0, 400, (4, 5), generator=gen),
             "backward_targets": torch.randint(0, 400, (4, 5), generator=gen),
             "reset": torch.ones(4, dtype=torch.bool)}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_ddp_step, args=(port, batch, str(tmp_path / "ddp.pt")), nprocs=2)
    single = _elmo_step_module()
    _one_step(single, batch, devices=1)
    expected, ddp = _gradients(single), torch.load(tmp_path / "ddp.pt")
    assert ddp["model.softmax.weight"].is_sparse and expected["model.softmax.weight"].is_sparse
    for name, grad in expected.items():
        torch.testing.assert_close(ddp[name].to_dense(), grad.to_dense(), rtol=1e-4, atol=1e-7, msg=name)
