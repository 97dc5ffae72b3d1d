"""Sentence splitting of whitespace-collapsed paragraphs: blingfire where it runs, nupunkt elsewhere.

Blingfire is a C++ finite-state splitter behind ctypes, and its wheel carries x86-64 libraries only: on aarch64
(GH200, Graviton, Apple silicon) importing it fails. There nupunkt takes over: a maintained pure-Python Punkt
(Kiss & Strunk 2006) with no dependencies and a trained English model (tuned for legal text, abbreviation-heavy). On
200 BBC news articles it splits 998 of 1028 paragraphs exactly as blingfire does, at half blingfire's speed (5 against
11 MB/s per core); pysbd, the better-known pure-Python splitter, agreed on 982 at 0.17 MB/s. The two still split
some text differently, so which one ran is part of the prepared corpus's identity: the manifest records it and the
prepare stage's cache key includes it (`splitter_identity`).
"""
from __future__ import annotations

import functools
import importlib.metadata
import platform
import re
from collections.abc import Callable, Sequence

from data_prep.corpus.chinese import CLOSERS, has_cjk, split_chinese_sentences

SPLITTERS = ("blingfire", "nupunkt")
_X86_64 = ("x86_64", "amd64")  # platform.machine() on Linux and macOS; on Windows


class SentenceSplitError(Exception):
    """The splitter returned nothing, or lost paragraph boundaries; the book is rejected with this message."""


@functools.cache
def blingfire_unavailable() -> str:
    """Why blingfire cannot split sentences on this machine, or "" when it can."""
    machine = platform.machine()
    if machine.lower() not in _X86_64:
        return f"blingfire ships x86-64 binaries only and this machine is {machine}"
    try:
        import blingfire  # noqa: F401  (loads its native library on import)
    except (ImportError, OSError) as exc:
        return f"blingfire cannot be loaded ({type(exc).__name__}: {exc})"
    return ""


def default_splitter() -> str:
    return "nupunkt" if blingfire_unavailable() else "blingfire"


def splitter_identity(name: str) -> str:
    """The splitter and its installed version, e.g. "blingfire 0.1.8": what decides how a corpus is split."""
    return f"{name} {importlib.metadata.version(name)}"


def fallback_notice() -> str:
    """One line saying that nupunkt replaces blingfire on this machine and why; "" where blingfire runs."""
    reason = blingfire_unavailable()
    if not reason:
        return ""
    return (f"NOTICE: sentences are split with {splitter_identity('nupunkt')} instead of blingfire ({reason}); "
            "the shards differ slightly from those of an x86-64 machine")


# Blingfire treats newlines as spaces but always ends a sentence at U+2029 PARAGRAPH SEPARATOR, so a whole
# book goes through it in one call with paragraphs joined by this character. One call per paragraph spent
# half of process_book's time in blingfire's Python wrapper (a ctypes buffer per call). The paragraphs
# cannot contain the character themselves: it is whitespace, collapsed to " " by reflow_paragraphs.
_PARAGRAPH_SEPARATOR = "\u2029"


def _blingfire_split(paragraphs: Sequence[str]) -> list[list[str]]:
    import blingfire

    joined = f" {_PARAGRAPH_SEPARATOR} ".join(paragraphs)
    split = blingfire.text_to_sentences(joined)
    if not split and joined.strip():
        # The wrapper returns "" when the C library fails, instead of raising.
        raise SentenceSplitError(f"blingfire could not split {len(joined.encode())} bytes of text")
    del joined  # a whole book: do not hold it through the loop below
    by_paragraph = [[sentence for sentence in map(str.strip, block.split("\n")) if sentence]
                    for block in split.split(_PARAGRAPH_SEPARATOR)]
    if len(by_paragraph) != len(paragraphs):
        raise SentenceSplitError(f"blingfire returned {len(by_paragraph)} paragraphs for {len(paragraphs)}")
    return by_paragraph


@functools.cache
def _punkt():
    import nupunkt

    return nupunkt.load("default")


def _nupunkt_split(paragraphs: Sequence[str]) -> list[list[str]]:
    tokenizer = _punkt()
    return [[sentence for sentence in map(str.strip, tokenizer.tokenize(paragraph)) if sentence]
            for paragraph in paragraphs]


_SPLIT: dict[str, Callable[[Sequence[str]], list[list[str]]]] = {"blingfire": _blingfire_split,
                                                                  "nupunkt": _nupunkt_split}

# blingfire 0.1.8 knows "Mr." inside a sentence but splits after it when it starts one:
# "He left the house. Mr. Smith came in." -> "He left the house." | "Mr." | "Smith came in.". In
# gutenberg-raw about 1 sentence in 500 is such a fragment (a title or an initial, often after a quote).
_TITLE_OR_INITIAL = re.compile(
    r"[\"'\u201c\u2018(\[]?(?:Mr|Mrs|Ms|Messrs|Mme|Mlle|Dr|St|Prof|Rev|Capt|Col|Gen|Lt|Sgt|Hon|[A-Z])\."
)
_LONGEST_TITLE_OR_INITIAL = len('"Messrs.')


def split_sentences(paragraphs: Sequence[str], splitter: str | None = None) -> list[list[str]]:
    """One list of sentences per whitespace-collapsed paragraph, split by `splitter` (one of SPLITTERS; None: this
    machine's `default_splitter`), with title/initial fragments glued back onto the sentence they begin.

    A paragraph with Chinese characters is first cut at its Chinese sentence ends (data_prep/corpus/chinese.py): both
    English
    splitters know 。 at best (blingfire ends the sentence before its closing ” and starts the next with it) and
    neither knows ！？；…; the pieces then go through `splitter`, which splits the English sentences among them."""
    split = _SPLIT[splitter or default_splitter()]
    if not any(map(has_cjk, paragraphs)):
        return [_glue_title_fragments(sentences) for sentences in split(paragraphs)]
    pieces_by_paragraph = [split_chinese_sentences(p) if has_cjk(p) else [p] for p in paragraphs]
    sentences_by_piece = iter(split([piece for pieces in pieces_by_paragraph for piece in pieces]))
    return [_glue_title_fragments(_closers_to_previous([s for _ in pieces for s in next(sentences_by_piece)]))
            for pieces in pieces_by_paragraph]


_LEADING_CLOSERS = re.compile(f"[{CLOSERS}]+")


def _closers_to_previous(sentences: list[str]) -> list[str]:
    """Closing quotes and brackets that start a sentence moved to the end of the one before, where they belong:
    blingfire cuts “走吧。”然后 after 。 (a sentence of only closers is dropped into the one before)."""
    fixed: list[str] = []
    for sentence in sentences:
        closers = _LEADING_CLOSERS.match(sentence)
        if closers and fixed:
            fixed[-1] += closers.group()
            sentence = sentence[closers.end():].strip()
        if sentence:
            fixed.append(sentence)
    return fixed


def _glue_title_fragments(sentences: list[str]) -> list[str]:
    if all(len(sentence) > _LONGEST_TITLE_OR_INITIAL for sentence in sentences[:-1]):
        return sentences  # nearly every paragraph: nothing short enough to be a fragment
    glued = sentences[:1]
    for sentence in sentences[1:]:
        if _TITLE_OR_INITIAL.fullmatch(glued[-1]):
            glued[-1] += " " + sentence
        else:
            glued.append(sentence)
    return glued
