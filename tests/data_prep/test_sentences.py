"""Sentence splitting off x86-64 (issue 18, item 7): where blingfire's library cannot load, nupunkt splits instead."""
from __future__ import annotations

import ctypes
import sys

import pytest

from data_prep.corpus import sentences
from data_prep.corpus.ingest import IngestOptions, process_book


@pytest.fixture(autouse=True)
def fresh_detection():
    sentences.blingfire_unavailable.cache_clear()
    yield
    sentences.blingfire_unavailable.cache_clear()


def _refuse_native_library(path, *args, **kwargs):
    raise OSError(f"{path}: wrong ELF class: ELFCLASS64")  # what loading an x86-64 .so on aarch64 says


def test_an_aarch64_machine_does_not_try_blingfire(monkeypatch):
    monkeypatch.setattr(sentences.platform, "machine", lambda: "aarch64")
    assert "x86-64 binaries only and this machine is aarch64" in sentences.blingfire_unavailable()
    assert sentences.default_splitter() == "nupunkt"
    assert IngestOptions().sentence_splitter == "nupunkt"


@pytest.mark.parametrize("failure, error", [("not installed", "ModuleNotFoundError"),
                                            ("library does not load", "OSError")])
def test_blingfire_that_cannot_be_imported_falls_back(monkeypatch, failure, error):
    monkeypatch.setattr(sentences.platform, "machine", lambda: "x86_64")
    if failure == "not installed":  # e.g. an environment built without it
        monkeypatch.setitem(sys.modules, "blingfire", None)
    else:  # installed without its marker: its import loads the library with ctypes
        monkeypatch.delitem(sys.modules, "blingfire", raising=False)
        monkeypatch.setattr(ctypes.cdll, "LoadLibrary", _refuse_native_library)
    assert sentences.blingfire_unavailable().startswith(f"blingfire cannot be loaded ({error}: ")
    assert sentences.default_splitter() == "nupunkt"
    assert sentences.fallback_notice().startswith("NOTICE: sentences are split with nupunkt 0.8.0 instead of blingfire")
    assert "\n" not in sentences.fallback_notice()


def test_blingfire_is_the_splitter_where_it_loads():
    if sentences.blingfire_unavailable():
        pytest.skip(f"not on this machine: {sentences.blingfire_unavailable()}")
    assert sentences.default_splitter() == "blingfire" and sentences.fallback_notice() == ""


BOOK = """\
He left the house. Mr. Smith came in and sat
down. Dr. Watson arrived at noon. Mrs. Hudson let him in.

Is it true? Yes! It is. "Where are you going?" she
asked. "Home," he said. 'Stop!' cried the captain. Nobody
stopped. He said, \u201cCome here.\u201d She came.

It cost $3.50 at the shop. The U.S. Army arrived at 5 p.m. and it
was late. He wrote to J. R. R. Tolkien. No reply came.
"""

SPLIT = [
    # a title, at the start of a sentence or not, ends nothing
    "He left the house.", "Mr. Smith came in and sat down.", "Dr. Watson arrived at noon.", "Mrs. Hudson let him in.",
    # "?" and "!" end sentences; a closing quote stays with its sentence, and a quote followed by lower case goes on
    "Is it true?", "Yes!", "It is.", '"Where are you going?" she asked.', '"Home," he said.',
    "'Stop!' cried the captain.", "Nobody stopped.", "He said, \u201cCome here.\u201d", "She came.",
    # decimals, abbreviations and initials end nothing
    "It cost $3.50 at the shop.", "The U.S. Army arrived at 5 p.m. and it was late.", "He wrote to J. R. R. Tolkien.",
    "No reply came.",
]


def test_the_fallback_splits_a_small_book_sensibly(monkeypatch):
    monkeypatch.setattr(sentences, "blingfire_unavailable", lambda: "blingfire ships x86-64 binaries only")
    options = IngestOptions(min_tokens=1)
    assert options.sentence_splitter == "nupunkt"
    result = process_book("book.txt", BOOK.encode(), options)
    assert [text for _, _, text in result.sentences] == SPLIT
    assert [paragraph for paragraph, _, _ in result.sentences] == [0] * 4 + [1] * 9 + [2] * 4


def test_an_unknown_splitter_is_refused():
    with pytest.raises(ValueError, match="sentence_splitter='punkt' is not one of"):
        IngestOptions(sentence_splitter="punkt")
