"""Chinese (and mixed Chinese/English) text in the data stages: which characters are CJK, where Chinese sentences end,
how hard-wrapped Chinese lines join, how long a Chinese sentence is, where its words are, and which of the two scripts
it is written in.

Chinese is written without spaces, so every rule the pipeline had for "words" (whitespace runs, `\\w+`) took a Chinese
paragraph for one word. The conventions here are the ones the field's Chinese models use:
- a CJK character is one token, as BERT-Chinese's BasicTokenizer makes it (google-research/bert tokenization.py,
  `_tokenize_chinese_chars`, whose code-point ranges `CJK_IDEOGRAPHS` repeats): length filters, decontamination n-grams
  and near-duplicate shingles count characters;
- word-level models (ELMo, Skip-Thought, bag-of-words baselines) read words from a segmenter, jieba (Sun Junyi's, the
  most used one, dictionary + HMM for unknown words) by default, or single characters (`data.chinese_words`);
- sentences end at 。！？； and … (the full stop, exclamation and question marks, semicolon and ellipsis of GB/T
  15834-2011, Chinese punctuation usage), with the closing quotes and brackets that follow them;
- traditional and simplified characters are converted by OpenCC (its t2s and s2t configurations) where a corpus mixes
  them (`data.chinese_variant`).
"""
from __future__ import annotations

import functools
import logging
import re

# google-research/bert's _is_chinese_char: the CJK Unified Ideographs blocks and their extensions, and the
# compatibility ideographs. Not Hangul or kana (Korean and Japanese are written with spaces or read by other rules).
CJK_IDEOGRAPHS = ("\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002b73f"
                  "\U0002b740-\U0002b81f\U0002b820-\U0002ceaf\U0002f800-\U0002fa1f")
# Characters that a Chinese line runs into without a space: ideographs, kana, CJK punctuation (U+3000-U+303F, 。、「」
# 《》), full-width forms (U+FF00-U+FFEF: ，！？（）：；and full-width digits) and the curly quotes and dashes/ellipsis
# Chinese text uses (“”‘’——……, General Punctuation).
_WIDE = CJK_IDEOGRAPHS + "\u3000-\u30ff\uff00-\uffef\u2018\u2019\u201c\u201d\u2014\u2026"
_HAS_CJK = re.compile(f"[{CJK_IDEOGRAPHS}]")
_CJK_CHAR = re.compile(f"[{CJK_IDEOGRAPHS}]")
_CJK_RUN = re.compile(f"[{CJK_IDEOGRAPHS}]+")
# A line break (and the spaces around it) between two wide characters: the line was wrapped inside a Chinese word or
# sentence, and joining with a space would put one there.
_WIDE_LINE_BREAK = re.compile(f"(?<=[{_WIDE}])[ \\t]*\\n[ \\t]*(?=[{_WIDE}])")
# The end of a Chinese sentence: 。！？；, an ellipsis (…, or …… as Chinese writes it), ASCII ! and ? right after an
# ideograph (reviews type them), each with the closing quotes and brackets that belong to the sentence before
# (他说：“走吧。”然后……). An ellipsis or mark followed by a comma or colon is inside a sentence.
CLOSERS = "”’」』）)》〉】〗"
_SENTENCE_END = re.compile(f"(?:[。！？；]+|…+|(?<=[{CJK_IDEOGRAPHS}])[!?]+)[{CLOSERS}]*(?![，,、：:…])")
# Tokens as BERT-Chinese counts them: each ideograph, and each whitespace-separated run of anything else.
_TOKEN = re.compile(f"[{CJK_IDEOGRAPHS}]|[^\\s{CJK_IDEOGRAPHS}]+")

CHINESE_WORDS = ("jieba", "characters")  # data.chinese_words
CHINESE_VARIANTS = ("keep", "simplified", "traditional")  # data.chinese_variant
_OPENCC_CONFIG = {"simplified": "t2s", "traditional": "s2t"}


def has_cjk(text: str) -> bool:
    return _HAS_CJK.search(text) is not None


def join_wrapped_lines(block: str) -> str:
    """A hard-wrapped paragraph's line breaks between two wide (Chinese) characters removed, so that re-flowing it
    joins those lines without a space; the other line breaks stay, for the caller to collapse into spaces between
    Latin words. Full-width punctuation is kept as it is."""
    return _WIDE_LINE_BREAK.sub("", block)


def split_chinese_sentences(paragraph: str) -> list[str]:
    """The paragraph cut after each Chinese sentence end (see _SENTENCE_END); a paragraph without one is one piece.
    The pieces still hold any English sentences, for the English splitter to split."""
    pieces, start = [], 0
    for match in _SENTENCE_END.finditer(paragraph):
        pieces.append(paragraph[start:match.end()])
        start = match.end()
    pieces.append(paragraph[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


def count_tokens(text: str) -> int:
    """Tokens as BERT-Chinese counts them: one per CJK ideograph, plus one per whitespace-separated run of other
    characters ("我爱Python。" is 我 爱 Python。: 3)."""
    return len(_TOKEN.findall(text))


def cjk_tokens(text: str) -> list[str]:
    """The tokens `count_tokens` counts: each CJK ideograph alone, other text split at whitespace."""
    return _TOKEN.findall(text)


def cjk_characters_apart(text: str) -> str:
    """`text` with a space on either side of every CJK ideograph (BERT's _tokenize_chinese_chars), for a splitter that
    splits at whitespace or on `\\w+`."""
    return _CJK_CHAR.sub(r" \g<0> ", text)


@functools.cache
def _jieba():
    import jieba

    jieba.setLogLevel(logging.WARNING)  # it logs the loading of its dictionary at INFO, once per process
    jieba.initialize()
    return jieba


def segment_chinese(text: str, chinese_words: str = "jieba") -> str:
    """`text` with spaces between its Chinese words (jieba's, in its default accurate mode with the HMM for words
    outside its dictionary) or between its CJK characters (`chinese_words="characters"`); the rest of the text is left
    as it is, so a word-level tokenizer that splits at whitespace and punctuation then splits Chinese into words and
    English as before. Text without CJK characters comes back unchanged, without loading jieba."""
    if chinese_words not in CHINESE_WORDS:
        raise ValueError(f"data.chinese_words={chinese_words!r} is not one of {CHINESE_WORDS}")
    if not has_cjk(text):
        return text
    if chinese_words == "characters":
        return cjk_characters_apart(text)
    jieba = _jieba()
    return _CJK_RUN.sub(lambda run: " " + " ".join(jieba.lcut(run.group(), HMM=True)) + " ", text)


@functools.cache
def _converter(variant: str):
    import opencc

    return opencc.OpenCC(_OPENCC_CONFIG[variant])


def convert_variant(text: str, variant: str) -> str:
    """`text` in simplified or traditional characters (OpenCC's t2s / s2t, character and phrase tables), or as it is
    with "keep"; text without CJK characters is returned unchanged."""
    if variant not in CHINESE_VARIANTS:
        raise ValueError(f"data.chinese_variant={variant!r} is not one of {CHINESE_VARIANTS}")
    if variant == "keep" or not has_cjk(text):
        return text
    return _converter(variant).convert(text)
