"""BERT-style WordPiece tokenizer: training, saving in Hugging Face format, loading and fast id encoding.

The tokenizer reproduces the pipeline of google-research/bert's ``tokenization.FullTokenizer`` (BasicTokenizer:
clean text, split CJK characters, optional lowercasing and accent stripping, split on whitespace and punctuation;
then greedy longest-match-first WordPiece with "##" continuation pieces) using the Rust ``tokenizers`` library.

Special tokens sit at fixed ids so that model and data code can refer to them without a vocabulary lookup:

    ===== ===  =========================================================
    token  id  use
    ===== ===  =========================================================
    [PAD]   0  padding; id 0 so that zero-initialised buffers are padding
    [UNK]   1  out-of-vocabulary word (WordPiece could not split it)
    [CLS]   2  first token of every sequence; its state feeds the NSP head
    [SEP]   3  ends segment A and segment B
    [MASK]  4  replaces tokens selected for the masked-LM objective
    ===== ===  =========================================================

(The released BERT vocabularies use 0/100/101/102/103; a freshly trained vocabulary has no reason to keep the
99 unused slots in between.)

The vocabulary is learned here, by the algorithm of ``tokenizers``' WordPieceTrainer (BPE merges over the corpus's
word counts, "##" marking pieces inside a word), not by that trainer: it numbers the pieces in hash-map order and
breaks ties between merges of equal count by those numbers, so two trainings on the same sentences gave different
ids and, where counts tie, different pieces (measured on the default corpus: 217 of 8,000 ids moved, 2 pieces
differed). Every example, embedding row and random initialisation downstream changed with them. Here the pieces'
order, and so the tie-break, is deterministic, and a training is a function of its sentences alone.
"""

from __future__ import annotations

import heapq
import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# This order *is* the id assignment documented above: the special tokens come before any learned piece.
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
CONTINUATION_PREFIX = "##"

TOKENIZER_FILE = "tokenizer.json"
# Sentences joined per string when counting words: few enough that only one batch of the corpus is ever held
# in memory.
_TRAIN_BATCH_SIZE = 1000
_SPACES = re.compile(r"[ \t\n\r]+")


def _batches(sentences: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(sentences)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def train_wordpiece(
    sentences: Iterable[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 30522,
    min_frequency: int = 2,
    lowercase: bool = True,
    limit_alphabet: int | None = None,
    model_max_length: int = 512,
) -> Tokenizer:
    """Train a BERT WordPiece tokenizer on ``sentences`` and save it in Hugging Face format in ``out_dir``.

    ``sentences`` is consumed once, in batches, so memory depends on the number of distinct words, not on the
    size of the corpus. Defaults follow BERT-base uncased (vocabulary of 30,522 pieces, lowercased, accents
    stripped). Each CJK character is a word of its own (BertNormalizer's handle_chinese_chars puts spaces around it,
    as BERT-Chinese does), and the alphabet is every character of the corpus (`limit_alphabet` None: a Chinese corpus
    has thousands, where HF's trainer keeps 1,000 by default and sends the rest to [UNK]) or the `limit_alphabet` most
    frequent ones. ``out_dir`` receives ``tokenizer.json`` (for
    :func:`load_tokenizer`) plus ``vocab.txt``, ``tokenizer_config.json`` and ``special_tokens_map.json`` so that
    ``transformers.BertTokenizerFast.from_pretrained(out_dir)`` loads the same tokenizer.
    """
    # strip_accents=None follows `lowercase`, as BERT's BasicTokenizer does (uncased models strip accents,
    # cased ones keep them).
    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"tokenizer.vocab_size={vocab_size} leaves no room for word pieces next to the "
                         f"{len(SPECIAL_TOKENS)} special tokens {SPECIAL_TOKENS}; raise it (BERT's is 30,522)")
    words = count_words(sentences, normalizer, pre_tokenizer)
    try:
        pieces = learn_wordpieces(words, vocab_size - len(SPECIAL_TOKENS), min_frequency, limit_alphabet)
    except AlphabetTooLarge as err:
        raise ValueError(f"tokenizer.vocab_size={vocab_size} is too small for this corpus: {err}, so every word "
                         f"holding one of the others would be [UNK]; set tokenizer.vocab_size to at least "
                         f"{len(SPECIAL_TOKENS) + err.pieces} (the {len(SPECIAL_TOKENS)} special tokens and those "
                         "pieces; a vocabulary that learns words needs many more: BERT's is 30,522), or "
                         "tokenizer.limit_alphabet to the number of characters to keep") from None
    if not pieces:
        raise ValueError("the training corpus yielded no word pieces; pass non-empty sentences to train_wordpiece")
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *pieces))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=UNK_TOKEN, continuing_subword_prefix=CONTINUATION_PREFIX))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))  # never split or normalised inside a text
    # BERT's input format: [CLS] A [SEP] for one segment, [CLS] A [SEP] B [SEP] with token type 1 on B's side.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS_TOKEN} $A {SEP_TOKEN}",
        pair=f"{CLS_TOKEN} $A {SEP_TOKEN} $B:1 {SEP_TOKEN}:1",
        special_tokens=[(CLS_TOKEN, CLS_ID), (SEP_TOKEN, SEP_ID)],
    )
    save_hf_tokenizer(tokenizer, Path(out_dir), lowercase=lowercase, model_max_length=model_max_length)
    return tokenizer


def count_words(sentences: Iterable[str], normalizer, pre_tokenizer) -> Counter:
    """How often each word (the pre-tokenizer's unit: BERT splits on whitespace and punctuation) occurs."""
    chunks = Counter()  # the text between spaces, before normalisation: far fewer distinct ones than occurrences
    for batch in _batches(sentences, _TRAIN_BATCH_SIZE):
        chunks.update(_SPACES.split(" ".join(batch)))
    # BERT normalises character by character and maps \t\n\r to spaces, and its pre-tokenizer splits on spaces
    # first: so each distinct chunk is normalised and split once, with the same words as the whole text would give.
    counts = Counter()
    for chunk, count in chunks.items():
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(chunk)):
            counts[word] += count
    return counts


class AlphabetTooLarge(ValueError):
    """Fewer pieces asked for than the corpus's characters need to be spelled out."""

    def __init__(self, message: str, pieces: int):
        super().__init__(message)
        self.pieces = pieces


def learn_wordpieces(words: Counter, num_pieces: int, min_frequency: int,
                     limit_alphabet: int | None = None) -> list[str]:
    """At most `num_pieces` pieces, in the order learned: the alphabet, then each merge's result.

    The alphabet is every character of the corpus (`limit_alphabet` None, SentencePiece's character_coverage 1.0), or
    the `limit_alphabet` most frequent ones (rarer ones become [UNK] when encoding), as a word start and, where they
    occur inside words, as "##" continuations. Then, as in BPE (Sennrich et al. 2016), the most frequent adjacent pair
    of symbols over all words is merged into a new piece, until there are `num_pieces` or no pair occurs `min_frequency`
    times. Ties go to the pair of the earliest pieces (lowest ids), as in ``tokenizers``, whose order is made
    deterministic here: alphabet by frequency then character, "##" pieces sorted.

    Raises AlphabetTooLarge where `num_pieces` cannot hold the alphabet and its "##" forms: `vocab_size=10` once kept
    [UNK] and `e t a o n`, and pretraining scored "MLM acc 0.78" predicting [UNK]."""
    char_counts = Counter()
    for word, count in words.items():
        for char in word:
            char_counts[char] += count
    alphabet = sorted(char_counts, key=lambda c: (-char_counts[c], c))[:limit_alphabet]
    kept = set(alphabet)
    symbols: list[list[str]] = []  # each distinct word as its current pieces
    counts: list[int] = []
    for word, count in sorted(words.items()):
        chars = [c for c in word if c in kept]
        if chars:
            symbols.append([chars[0]] + [CONTINUATION_PREFIX + c for c in chars[1:]])
            counts.append(count)
    pieces = list(alphabet)
    pieces += sorted({s for word in symbols for s in word[1:]} - set(pieces))
    rank = {piece: i for i, piece in enumerate(pieces)}  # the tie-break: a piece's id, or would-be id
    if num_pieces < len(pieces):
        raise AlphabetTooLarge(f"{num_pieces} pieces cannot spell its {len(alphabet)} characters and the "
                               f"{len(pieces) - len(alphabet)} '##' forms of those found inside words "
                               f"({len(pieces)} pieces)", len(pieces))

    pair_counts: Counter = Counter()
    pair_words: dict[tuple[str, str], set[int]] = defaultdict(set)
    for index, word in enumerate(symbols):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += counts[index]
            pair_words[pair].add(index)

    def entry(pair, count):  # max-heap on count, then min on the pieces' ranks
        return -count, rank[pair[0]], rank[pair[1]], pair

    # Entries go stale when a count changes and are skipped when popped.
    heap = [entry(pair, count) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    while len(pieces) < num_pieces and heap:
        negative_count, _, _, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative_count:
            continue
        if -negative_count < min_frequency:
            break
        merged = pair[0] + pair[1].removeprefix(CONTINUATION_PREFIX)
        if merged not in rank:
            rank[merged] = len(rank)
            pieces.append(merged)
        changed = set()
        for index in pair_words.pop(pair):
            word, count = symbols[index], counts[index]
            for old_pair in zip(word, word[1:]):
                pair_counts[old_pair] -= count
                changed.add(old_pair)
            merged_word, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
                    merged_word.append(merged)
                    i += 2
                else:
                    merged_word.append(word[i])
                    i += 1
            symbols[index] = merged_word
            for new_pair in zip(merged_word, merged_word[1:]):
                pair_counts[new_pair] += count
                pair_words[new_pair].add(index)
                changed.add(new_pair)
        del pair_counts[pair]
        changed.discard(pair)
        for changed_pair in changed:
            if pair_counts[changed_pair] > 0:
                heapq.heappush(heap, entry(changed_pair, pair_counts[changed_pair]))
            else:
                del pair_counts[changed_pair]
    return pieces


def save_hf_tokenizer(tokenizer: Tokenizer, out_dir: Path, *, lowercase: bool, model_max_length: int) -> None:
    """Write `tokenizer` (trained by :func:`train_wordpiece` with `lowercase`) as the files of a transformers
    ``BertTokenizerFast``; `model_max_length` is the longest input the model it goes with was trained on."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / TOKENIZER_FILE))
    tokenizer.model.save(str(out_dir))  # WordPiece writes vocab.txt, one piece per line in id order
    special_tokens_map = {
        "pad_token": PAD_TOKEN,
        "unk_token": UNK_TOKEN,
        "cls_token": CLS_TOKEN,
        "sep_token": SEP_TOKEN,
        "mask_token": MASK_TOKEN,
    }
    config = {
        "tokenizer_class": "BertTokenizerFast",
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": model_max_length,
        **special_tokens_map,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_tokens_map, indent=2) + "\n")


def checkpoint_tokenizer(directory: Path) -> tuple[Tokenizer, bool]:
    """The tokenizer saved beside a HuggingFace BERT checkpoint (its `tokenizer.json`, or its `vocab.txt` read as
    BERT's WordPiece) and whether it lower-cases. Its special tokens keep the checkpoint's ids (a released BERT
    vocabulary has [UNK] at 100, not 1): code that needs them looks them up."""
    config = directory / "tokenizer_config.json"
    lowercase = json.loads(config.read_text()).get("do_lower_case", True) if config.is_file() else True
    if (directory / TOKENIZER_FILE).is_file():
        tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
    elif (directory / "vocab.txt").is_file():
        from tokenizers.implementations import BertWordPieceTokenizer

        tokenizer = BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=lowercase)._tokenizer
    else:
        raise FileNotFoundError(f"{directory} has no tokenizer.json or vocab.txt; put the tokenizer files of that "
                                "model beside its weights")
    missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        raise ValueError(f"the tokenizer in {directory} has no {', '.join(missing)}: it is not a BERT WordPiece "
                         "tokenizer")
    # sentence-transformers saves its tokenizer truncating and padding to 128 tokens (all-MiniLM-L6-v2 does); the
    # stages encode a shard's words in one call and cut the sequences themselves
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer, lowercase


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load a tokenizer saved by :func:`train_wordpiece` (reads ``directory/tokenizer.json``)."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; train a tokenizer into {directory} with train_wordpiece first")
    return Tokenizer.from_file(str(path))


# More of the corpus's tokens than this unknown to a vocabulary, and its stage warns: a model then learns to predict
# the unknown token (vocab_size=10 scored "MLM acc 0.78"), and downstream tasks see it for words they need.
UNKNOWN_RATE_WARNING = 0.01
# A subword vocabulary can spell every word of its alphabet, so its unknown tokens are characters left out of the
# alphabet: above 0.5 % a Chinese corpus is losing characters that words need
WORDPIECE_UNKNOWN_RATE_WARNING = 0.005
# The rate of a subword vocabulary is measured on at most this many sentences, evenly spaced through the corpus
# (data_prep.corpus.shards.sampled_texts): a second pass over the whole training sample would cost as much as its
# counting.
UNKNOWN_RATE_SENTENCES = 100_000


def unknown_tokens(tokenizer: Tokenizer, texts: Iterable[str]) -> tuple[int, int]:
    """(unknown tokens, all tokens) of `texts` encoded by `tokenizer` (special tokens not added); a tokenizer without
    an unknown token (GPT's byte-level BPE) has none."""
    unknown_token = getattr(tokenizer.model, "unk_token", None)
    unknown_id = tokenizer.token_to_id(unknown_token) if unknown_token else None
    unknown = total = 0
    for batch in _batches(texts, _TRAIN_BATCH_SIZE):
        for encoding in tokenizer.encode_batch_fast(batch, add_special_tokens=False):
            total += len(encoding.ids)
            unknown += encoding.ids.count(unknown_id) if unknown_id is not None else 0
    return unknown, total


def unknown_words(counts: Counter, vocabulary: Iterable[str]) -> tuple[int, int]:
    """(occurrences of words outside `vocabulary`, all occurrences) of a word count."""
    total = sum(counts.values())
    return total - sum(counts.get(word, 0) for word in set(vocabulary)), total


def unknown_rate_summary(unknown: int, total: int, vocab_key: str, unit: str = "tokens",
                         warn_above: float = UNKNOWN_RATE_WARNING) -> dict:
    """The stage.json fields of a vocabulary's unknown-token rate, printing a warning above `warn_above`."""
    rate = unknown / total if total else 0.0
    warning = None
    if rate > warn_above:
        warning = (f"{rate:.1%} of the corpus's {unit} ({unknown:,} of {total:,}) are unknown to the vocabulary; raise "
                   f"{vocab_key} (or lower the minimum count) unless that is intended")
        print(f"WARNING: {warning}", flush=True)
    return {"unknown_rate": round(rate, 6), "unknown_rate_warning": warning}


def encode_batch_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without [CLS]/[SEP] (instances are assembled later from several sentences).

    ``encode_batch_fast`` skips offset tracking, which pretraining never needs; the batch is split over the Rust
    thread pool (RAYON_NUM_THREADS caps it; TOKENIZERS_PARALLELISM=false turns it off).
    """
    return [encoding.ids for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
