"""Turns the bytes of one book into cleaned, sentence-split rows.

Pure functions, no Ray and no file I/O: `data_prep.corpus.prepare` reads the files and maps `process_book`
over groups of them. Like google-research/bert's `create_pretraining_data.py`, the output keeps the
book -> paragraph -> sentence structure, because the pair/triple builders downstream (BERT's
next-sentence pairs, Skip-Thought's (previous, current, next) triples) take neighbouring sentences of
one document.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import itertools
import re
import unicodedata
from collections.abc import Sequence
from pathlib import PurePath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_prep.corpus.chinese import CHINESE_VARIANTS, convert_variant, count_tokens, has_cjk, join_wrapped_lines
from data_prep.corpus.decontaminate import EvaluationOverlap
from data_prep.corpus.sentences import SPLITTERS, SentenceSplitError, default_splitter, split_sentences
from data_prep.corpus.shards import book_rows

INPUT_FORMATS = ("raw", "sentence_per_line")


@dataclasses.dataclass(frozen=True)
class IngestOptions:
    """How a book is cleaned and split; stored in the manifest, so every field must be JSON-friendly.

    input_format: "raw" (hard-wrapped prose, split into sentences by `sentence_splitter`) or
        "sentence_per_line" (already split: one sentence per line, a blank line ends a paragraph).
    sentence_splitter: one of data_prep.corpus.sentences.SPLITTERS; by default blingfire, or nupunkt where blingfire's
        x86-64 library cannot load. Chosen where the options are made, so worker processes split as it says.
    min_tokens / max_tokens: inclusive bounds on tokens per sentence: whitespace tokens, and each CJK character one
        token as BERT-Chinese counts them (data_prep/corpus/chinese.py). Shorter ones are mostly headings and ornaments
        ("CHAPTER I.", "* * *"); longer ones are run-on tables or lists that BERT's create_pretraining_data would
        truncate anyway (max_seq_length 128/512).
    nfkc: apply Unicode NFKC (folds ligatures, full-width forms, "…" -> "...") before splitting.
    chinese_variant: "keep", or convert Chinese text to "simplified" or "traditional" characters (OpenCC), for
        corpora that mix them.
    """

    input_format: str = "raw"
    min_tokens: int = 3
    max_tokens: int = 200
    nfkc: bool = False
    sentence_splitter: str = dataclasses.field(default_factory=default_splitter)
    chinese_variant: str = "keep"

    def __post_init__(self):
        if self.input_format not in INPUT_FORMATS:
            raise ValueError(f"data.input_format={self.input_format!r} is not supported; use one of {INPUT_FORMATS}")
        if self.chinese_variant not in CHINESE_VARIANTS:
            raise ValueError(f"data.chinese_variant={self.chinese_variant!r} is not one of {CHINESE_VARIANTS}")
        if self.sentence_splitter not in SPLITTERS:
            raise ValueError(f"sentence_splitter={self.sentence_splitter!r} is not one of {SPLITTERS}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"need 1 <= data.min_tokens <= data.max_tokens, got data.min_tokens={self.min_tokens}, "
                f"data.max_tokens={self.max_tokens}; fix the bounds"
            )


@dataclasses.dataclass(frozen=True)
class BookResult:
    """What `process_book` made of one file. `rows` holds the kept book's sentences as shard rows
    (`data_prep.corpus.shards.book_rows`): paragraph_index and sentence_index dense and 0-based within the book (a
    paragraph whose sentences were all filtered out gets no index). Arrow rather than a Python object per
    sentence, so a Ray task hands them to the driver as buffers. `fingerprint` is the exact-duplicate key
    (see `book_fingerprint`), empty when rejected."""

    book_id: str
    title: str
    author: str
    encoding: str
    num_bytes: int
    status: str  # "kept" or "rejected"
    reason: str = ""  # why it was rejected; empty when kept
    rows: pa.RecordBatch | None = None
    num_dropped_too_short: int = 0  # sentences of fewer than min_tokens tokens (space-separated; CJK: characters)
    num_dropped_too_long: int = 0  # and of more than max_tokens
    utf8_replacements: int = 0  # invalid sequences replaced by U+FFFD (see decode_book): UTF-8's, or UTF-16/32's
    nuls_removed: int = 0  # stray NUL characters deleted (see binary_content_reason)
    fingerprint: str = ""
    # sentences removed for overlapping the run's evaluation text, by source (data_prep/corpus/decontaminate.py); a
    # sentence
    # that overlaps two sources counts in both
    removed_as_evaluation_text: dict[str, int] = dataclasses.field(default_factory=dict)
    num_removed_as_evaluation_text: int = 0

    @property
    def num_dropped_by_length(self) -> int:
        return self.num_dropped_too_short + self.num_dropped_too_long

    @property
    def num_sentences(self) -> int:
        return self.rows.num_rows if self.rows is not None else 0

    @property
    def sentences(self) -> tuple[tuple[int, int, str], ...]:
        """(paragraph_index, sentence_index, text) of each kept sentence, as Python values."""
        if self.rows is None:
            return ()
        return tuple(zip(*(self.rows[name].to_pylist() for name in ("paragraph_index", "sentence_index", "text"))))

    @classmethod
    def rejected(cls, book_id: str, reason: str, *, num_bytes: int = 0, encoding: str = "",
                 title: str = "", author: str = "", num_dropped_too_short: int = 0,
                 num_dropped_too_long: int = 0, removed_as_evaluation_text: dict[str, int] | None = None,
                 num_removed_as_evaluation_text: int = 0) -> BookResult:
        return cls(book_id=book_id, title=title or PurePath(book_id).stem, author=author, encoding=encoding,
                   num_bytes=num_bytes, status="rejected", reason=reason, num_dropped_too_short=num_dropped_too_short,
                   num_dropped_too_long=num_dropped_too_long,
                   removed_as_evaluation_text=removed_as_evaluation_text or {},
                   num_removed_as_evaluation_text=num_removed_as_evaluation_text)


# ---------------------------------------------------------------------------------------------- decoding

# UTF-8 first (what Gutenberg ships today); CP-1252 next because most legacy "ASCII" e-texts with curly
# quotes are Windows-1252; Latin-1 last because it maps every byte, so decoding never fails.
_LEGACY_ENCODINGS = ("cp1252", "latin-1")


# UTF-32's little-endian mark begins with UTF-16's, so it is tried first.
_ENCODING_OF_BYTE_ORDER_MARK = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
                                (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
BYTE_ORDER_MARKS = tuple(mark for mark, _ in _ENCODING_OF_BYTE_ORDER_MARK)  # of the encodings decode_book reads


def decode_book(raw: bytes) -> tuple[str, str, int]:
    """Returns (text with LF line endings, encoding used, number of invalid sequences replaced by U+FFFD). Never
    raises.

    A UTF-16 or UTF-32 byte-order mark (what Windows Notepad's "Unicode" writes) decides the encoding. A UTF-8 file
    with a few corrupt bytes stays UTF-8, with each bad sequence replaced and counted: re-decoding it all as CP-1252
    would silently turn every accented letter and curly quote into mojibake ("\u00e2\u20ac\u2122" for "\u2019").
    It counts as UTF-8 when its valid non-ASCII characters outnumber the invalid sequences; otherwise it is a legacy
    8-bit file. The encoding is "utf-8-sig" when a UTF-8 byte-order mark was present (and removed).
    """
    for mark, encoding in _ENCODING_OF_BYTE_ORDER_MARK:
        if raw.startswith(mark):
            text = raw[len(mark):].decode(encoding, errors="replace")
            replacements = text.count("\ufffd") - raw[len(mark):].decode(encoding, errors="ignore").count("\ufffd")
            return text.replace("\r\n", "\n").replace("\r", "\n"), encoding, replacements
    has_bom = raw.startswith(codecs.BOM_UTF8)
    if has_bom:
        raw = raw[len(codecs.BOM_UTF8):]
    text = raw.decode("utf-8", errors="replace")
    # Counted without building per-character lists: this runs on whole books.
    replacements = text.count("\ufffd") - raw.count("\ufffd".encode("utf-8"))
    valid_non_ascii = len(text) - len(text.encode("ascii", errors="ignore")) - text.count("\ufffd")
    encoding = "utf-8-sig" if has_bom else "utf-8"
    if replacements and valid_non_ascii < replacements:
        replacements = 0
        for encoding in _LEGACY_ENCODINGS:
            try:
                text = raw.decode(encoding)
                break
            except UnicodeDecodeError:
                pass
    return text.replace("\r\n", "\n").replace("\r", "\n"), encoding, replacements


# C0/C1 control characters other than the whitespace ones (\t \n \v \f \r). A Latin-1 decode of binary
# data is full of them, and in otherwise good text they are noise to delete.
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
# Above this share of control/replacement characters a file is not prose (git and `file` use similar
# "looks like text" heuristics).
_MAX_NON_TEXT_FRACTION = 0.10
# Git calls a file binary for one NUL in its first 8000 bytes; here a few stray NULs (a glitch of some converters
# and editors) are deleted and counted instead of costing the whole book. Binary formats hold far more: 6-7% of the
# bytes of the PNG icons in matplotlib, 17-27% of a .so or a .pyc, 82% of a small executable. Compressed data holds
# few (0.3% of a .gz) but fails the control-character test.
_MAX_NUL_FRACTION = 0.01


def binary_content_reason(text: str) -> str:
    """Returns why the decoded file looks binary, or "" when it looks like text."""
    nuls = text.count("\x00")
    if nuls > _MAX_NUL_FRACTION * len(text):
        reason = f"binary file (contains NUL bytes: {nuls / len(text):.0%} of characters)"
        # ASCII text in UTF-16 has a NUL in every other byte.
        if any(text[start::2].count("\x00") > 0.9 * (len(text) // 2) for start in (0, 1)):
            reason += "; if it is UTF-16 text without a byte-order mark, save it as UTF-8"
        return reason
    non_text = len(_CONTROL_CHARS.findall(text)) + text.count("\ufffd")
    if text and non_text / len(text) > _MAX_NON_TEXT_FRACTION:
        return f"binary file ({non_text / len(text):.0%} of characters are control codes)"
    return ""


# ------------------------------------------------------------------------------ Project Gutenberg markers

# The marker spellings follow c-w/gutenberg's TEXT_START_MARKERS / TEXT_END_MARKERS
# (gutenberg/_domain_model/text.py), narrowed to whole-line matches so a sentence that merely mentions
# Project Gutenberg is not taken for a marker. Modern e-texts: "*** START OF THE/THIS PROJECT GUTENBERG
# EBOOK <title> ***" (sometimes "***START OF", sometimes wrapped onto a second line that ends in "***").
# Each marker pattern starts at the newline before its line (the text is searched with one prepended) rather than at ^:
# a pattern that begins with a literal lets Python's regex engine skip to the newlines instead of trying the pattern at
# every character, 3x faster over a book.
_START_MARKER = re.compile(
    r"\n[ \t]*\*{1,3}[ \t]*START OF (?:THE |THIS )?PROJECT GUTENBERG[^*\n]*(?:\*+|\n[^*\n]*\*{3})?[ \t]*$",
    re.MULTILINE | re.IGNORECASE,
)
# Pre-2003 e-texts put the licence ("the small print") first; the book starts after its end line,
# e.g. "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*".
_SMALL_PRINT_END = re.compile(r"\n[ \t]*\*END\*?[ \t]*THE SMALL PRINT.*$", re.MULTILINE | re.IGNORECASE)
# Whichever comes first ends the book: the "*** END OF ..." line, the "End of the Project Gutenberg
# EBook of ..." / "End of Project Gutenberg's ..." sentence that usually precedes it, or a small-print
# licence appended at the end (e.g. pg4657: "***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**").
_END_MARKER = re.compile(
    r"\n[ \t]*(?:\*{1,3}[ \t]*END OF (?:THE |THIS )?PROJECT GUTENBERG"
    r"|End of (?:the |this )?Project Gutenberg"
    r"|\*{1,3}[ \t]*START\**[ \t]*THE SMALL PRINT)",
    re.MULTILINE | re.IGNORECASE,
)
# The credit paragraph right after the start marker ("Produced by Judith Boss and David Widger") is
# another c-w/gutenberg start marker; it would otherwise become a sentence in nearly every book.
_PRODUCER_CREDIT = re.compile(
    r"\A\s*(?:Produced by|E-?text prepared by|This e-?text was (?:prepared|produced) by|Transcribed from)"
    r"[^\n]*(?:\n[ \t]*\S[^\n]*)*",
    re.IGNORECASE,
)
# "Title: The Mill on the Floss" in the header; a long value continues on indented lines.
_HEADER_FIELD = {
    field: re.compile(rf"^{field}:[ \t]*(\S[^\n]*(?:\n[ \t]+\S[^\n]*)*)", re.MULTILINE)
    for field in ("Title", "Author")
}


def strip_gutenberg_boilerplate(text: str) -> tuple[str, str]:
    """Returns (header, body): the licence header before the start marker and the book between the
    markers. A book without markers is all body, with an empty header."""
    lines = "\n" + text  # lines[i + 1] is text[i]: a match's leading newline sits at its line's index in text
    start = _START_MARKER.search(lines) or _SMALL_PRINT_END.search(lines)
    header, body_start = (text[:start.start()], start.end() - 1) if start else ("", 0)
    end = _END_MARKER.search(lines, body_start)  # from the newline before text[body_start]
    del lines
    body = text[body_start:end.start() if end else len(text)]
    if start:
        body = _PRODUCER_CREDIT.sub("", body, count=1)
    return header, body


def header_field(header: str, field: str) -> str:
    """The value of "Title:" or "Author:" in a Gutenberg header, continuation lines joined; "" if absent."""
    match = _HEADER_FIELD[field].search(header)
    return " ".join(match.group(1).split()) if match else ""


# ------------------------------------------------------------------------------ paragraphs and sentences

_BLANK_LINES = re.compile(r"\n[ \t\f\v]*\n\s*")
# str.split() builds a list of every word (~60 bytes each; Python's regex sub likewise builds a list of
# every piece), so collapsing a whole book on one 50 MB line in one go would cost ~1 GB. Chunks of this
# many characters, cut at whitespace, bound that to one chunk's words.
_COLLAPSE_CHUNK_CHARS = 1 << 16
_WHITESPACE = re.compile(r"\s")  # on str patterns exactly str.isspace(), the whitespace str.split() uses


def collapse_whitespace(text: str) -> str:
    """`" ".join(text.split())`, in memory proportional to the text rather than to its number of words."""
    if len(text) <= _COLLAPSE_CHUNK_CHARS:
        return " ".join(text.split())
    chunks = []
    start = 0
    while start < len(text):
        next_space = _WHITESPACE.search(text, start + _COLLAPSE_CHUNK_CHARS)
        end = next_space.start() if next_space else len(text)
        chunk = " ".join(text[start:end].split())
        if chunk:
            chunks.append(chunk)
        start = end
    return " ".join(chunks)


def split_paragraphs(body: str) -> list[list[str]]:
    """Blank lines separate paragraphs; returns each paragraph's non-empty lines, whitespace-collapsed."""
    paragraphs = []
    for block in _BLANK_LINES.split(body):
        lines = [collapse_whitespace(line) for line in block.split("\n")]
        lines = [line for line in lines if line]
        if lines:
            paragraphs.append(lines)
    return paragraphs


def reflow_paragraphs(body: str) -> list[str]:
    """Blank lines separate paragraphs; each hard-wrapped paragraph becomes one whitespace-collapsed line. Equal to
    joining `split_paragraphs`' lines with spaces, in one split per paragraph instead of one per line, except where a
    line ends and the next begins with Chinese characters: those join without a space (data_prep/corpus/chinese.py), as
    a
    space would sit inside a Chinese word."""
    blocks = _BLANK_LINES.split(body)
    if has_cjk(body):  # one scan of the body: books without Chinese keep the one-split-per-paragraph path
        blocks = [join_wrapped_lines(block) for block in blocks]
    paragraphs = (collapse_whitespace(block) for block in blocks)
    return [paragraph for paragraph in paragraphs if paragraph]


def clean_text(text: str, nfkc: bool) -> str:
    text = _CONTROL_CHARS.sub("", text)
    return unicodedata.normalize("NFKC", text) if nfkc else text


def corpus_form(text: str, nfkc: bool, chinese_variant: str) -> str:
    """`text` in the form prepare gives a book's body (data.nfkc, data.chinese_variant), which the run's tasks are read
    in too (pipeline/downstream/tasks.py in_corpus_form)."""
    return convert_variant(clean_text(text, nfkc), chinese_variant)


def book_fingerprint(paragraphs: Sequence[str]) -> str:
    """Exact-duplicate key: sha256 of the cleaned, whitespace-collapsed paragraphs, so copies that differ
    only in encoding, line endings, wrapping or Gutenberg boilerplate collide. Near duplicates are
    `data_prep.corpus.dedup`'s job."""
    digest = hashlib.sha256()
    for paragraph in paragraphs:
        digest.update(paragraph.encode("utf-8"))
        digest.update(b"\n\n")
    return digest.hexdigest()


def exact_duplicate_of(result: BookResult, first_by_fingerprint: dict[str, str]) -> str | None:
    """The book_id of an earlier kept book with the same fingerprint, else None (and `result` is
    registered as the first). Call it in input order so the first occurrence is the one kept."""
    first = first_by_fingerprint.setdefault(result.fingerprint, result.book_id)
    return None if first == result.book_id else first


def process_book(path: str | PurePath, raw: bytes, options: IngestOptions, book_id: str | None = None,
                 decontamination: EvaluationOverlap | None = None) -> BookResult:
    """Decodes, cleans and splits one book. Never raises on bad content: it returns a rejected result.

    path: the file's path relative to the corpus root; its POSIX form is the stable book_id (unless `book_id` is
        given: a part of a file too big to be one book) and its stem the title when the Gutenberg header has none.
    decontamination: the run's evaluation text; the sentences that overlap it are removed (after the length filter,
        so each removed sentence is counted once, under its reason).
    """
    book_id = book_id or PurePath(path).as_posix()
    text, encoding, utf8_replacements = decode_book(raw)
    if not text or text.isspace():  # not strip(): that would copy the whole book
        return BookResult.rejected(book_id, "empty file", num_bytes=len(raw), encoding=encoding)
    binary_reason = binary_content_reason(text)
    if binary_reason:
        return BookResult.rejected(book_id, binary_reason, num_bytes=len(raw), encoding=encoding)
    nuls_removed = text.count("\x00")
    if nuls_removed:
        text = text.replace("\x00", "")

    header, body = strip_gutenberg_boilerplate(text)
    del text  # a book can be large; the body is all that is needed from here on
    title = header_field(header, "Title") or PurePath(book_id).stem
    author = header_field(header, "Author")
    body = corpus_form(body, options.nfkc, options.chinese_variant)
    chinese = has_cjk(body)
    if options.input_format == "raw":
        paragraphs = reflow_paragraphs(body)  # a hard-wrapped paragraph is one run of text
    else:
        paragraph_lines = split_paragraphs(body)
        paragraphs = [" ".join(lines) for lines in paragraph_lines]
    del body
    common = dict(num_bytes=len(raw), encoding=encoding, title=title, author=author)
    if not paragraphs:
        return BookResult.rejected(book_id, "no text left after removing the Project Gutenberg header and footer",
                                   **common)
    fingerprint = book_fingerprint(paragraphs)
    if options.input_format == "raw":
        try:
            candidates_by_paragraph = split_sentences(paragraphs, options.sentence_splitter)
            del paragraphs
        except SentenceSplitError as exc:
            return BookResult.rejected(book_id, f"sentence splitter failed: {exc}", **common)
    else:
        candidates_by_paragraph = paragraph_lines

    # The length filter and the paragraph numbering run over Arrow/numpy columns, not a tuple per sentence.
    candidates = pa.array(itertools.chain.from_iterable(candidates_by_paragraph), pa.string())
    if chinese:
        num_tokens = np.fromiter(map(count_tokens, candidates.to_pylist()), dtype=np.int64, count=len(candidates))
    else:  # whitespace is collapsed to single spaces, so counting them counts tokens without a list of words
        num_tokens = pc.count_substring(candidates, " ").to_numpy() + 1
    too_short, too_long = num_tokens < options.min_tokens, num_tokens > options.max_tokens
    kept = ~(too_short | too_long)
    dropped = dict(num_dropped_too_short=int(too_short.sum()), num_dropped_too_long=int(too_long.sum()))
    if not kept.any():
        return BookResult.rejected(
            book_id,
            f"zero sentences after filtering: all {len(kept)} fall outside "
            f"data.min_tokens={options.min_tokens}..data.max_tokens={options.max_tokens} (tokens counted as "
            "space-separated runs, and each CJK character as one)",
            **dropped, **common,
        )
    removed = {}
    if decontamination is not None:
        overlapping, sources = decontamination.overlapping(candidates.to_pylist())
        overlapping &= kept
        removed = decontamination.source_counts(sources[overlapping])
        kept &= ~overlapping
        common["num_removed_as_evaluation_text"] = int(overlapping.sum())
        if not kept.any():
            return BookResult.rejected(book_id, f"zero sentences after removing the {int(overlapping.sum())} that "
                                       "overlap the run's evaluation text (data.decontaminate)",
                                       **dropped, removed_as_evaluation_text=removed, **common)
    paragraph_of = np.repeat(np.arange(len(candidates_by_paragraph)), [len(c) for c in candidates_by_paragraph])
    _, paragraph_index = np.unique(paragraph_of[kept], return_inverse=True)  # dense: emptied paragraphs get none
    rows = book_rows(book_id, title, paragraph_index, candidates.filter(kept))
    return BookResult(book_id=book_id, status="kept", rows=rows, **dropped,
                      utf8_replacements=utf8_replacements, nuls_removed=nuls_removed, fingerprint=fingerprint,
                      removed_as_evaluation_text=removed, **common)
