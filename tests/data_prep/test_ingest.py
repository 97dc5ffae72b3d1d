import pytest

from data_prep.corpus.ingest import (
    BookResult,
    IngestOptions,
    book_fingerprint,
    decode_book,
    exact_duplicate_of,
    process_book,
    split_paragraphs,
    strip_gutenberg_boilerplate,
)
from data_prep.corpus.sentences import split_sentences

GUTENBERG_BOOK = """\
The Project Gutenberg EBook of A Tiny Tale, by Jane Doe

Title: A Tiny Tale
       of Two Lines

Author: Jane Doe

*** START OF THIS PROJECT GUTENBERG EBOOK A TINY TALE ***

Produced by A Volunteer and
the Online Proofreading Team

It was a bright cold day in April, and the clocks
were striking thirteen. Mr. Smith walked home slowly.

The second paragraph starts here and it
is wrapped over two lines.

End of the Project Gutenberg EBook of A Tiny Tale, by Jane Doe

*** END OF THIS PROJECT GUTENBERG EBOOK A TINY TALE ***

This file should be named tiny.txt. Licence text follows here.
"""


def kept_texts(result: BookResult) -> list[str]:
    return [text for _, _, text in result.sentences]


def test_decode_strips_utf8_bom_and_normalises_line_endings():
    assert decode_book(b"\xef\xbb\xbfone\r\ntwo\rthree\n") == ("one\ntwo\nthree\n", "utf-8-sig", 0)
    assert decode_book("caf\u00e9".encode("utf-8")) == ("caf\u00e9", "utf-8", 0)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_utf16_and_utf32_with_a_byte_order_mark_read_as_their_utf8_text(encoding):
    mark = "\ufeff".encode(encoding)
    text = "\u201cCaf\u00e9 au lait,\u201d said the old sailor to the waiter.\r\nHe drank it by the window.\r\n"
    assert decode_book(mark + text.encode(encoding)) == (text.replace("\r\n", "\n"), encoding, 0)
    as_utf8, as_utf16 = (process_book("b.txt", raw, IngestOptions()) for raw in (text.encode(),
                                                                                 mark + text.encode(encoding)))
    assert (as_utf16.status, as_utf16.encoding) == ("kept", encoding)
    assert as_utf16.sentences == as_utf8.sentences and as_utf16.fingerprint == as_utf8.fingerprint


def test_stray_nuls_are_removed_and_counted():
    prose = "".join(f"Chapter {n} begins with the captain on the deck of his ship.\n" for n in range(8))
    result = process_book("b.txt", prose.replace("captain", "captain\x00", 3).encode(), IngestOptions())
    assert (result.status, result.nuls_removed) == ("kept", 3)
    assert kept_texts(result) == kept_texts(process_book("b.txt", prose.encode(), IngestOptions()))


def test_decode_falls_back_to_cp1252_then_latin1():
    # 0x93/0x94 are curly quotes in CP-1252 and invalid as UTF-8.
    assert decode_book(b"\x93Hi\x94") == ("\u201cHi\u201d", "cp1252", 0)
    # 0x81 is undefined in CP-1252, so only Latin-1 (which maps every byte) decodes it.
    assert decode_book(b"a\x81b") == ("a\x81b", "latin-1", 0)


def test_mostly_utf8_file_keeps_its_accents_and_counts_the_bad_bytes():
    # One stray byte must not turn every "\u2019" into CP-1252 mojibake; a genuine U+FFFD is not counted.
    raw = "It\u2019s caf\u00e9 time \ufffd.".encode() + b" \xff bad.\n"
    assert decode_book(raw) == ("It\u2019s caf\u00e9 time \ufffd. \ufffd bad.\n", "utf-8", 1)


def test_cp1252_book_records_its_encoding():
    raw = "\u201cQuoted,\u201d she said to him.\n".encode("cp1252")
    result = process_book("legacy.txt", raw, IngestOptions())
    assert result.status == "kept" and result.encoding == "cp1252"
    assert kept_texts(result) == ["\u201cQuoted,\u201d she said to him."]


def test_gutenberg_header_and_footer_are_stripped_and_metadata_parsed():
    result = process_book("sub/tiny.txt", GUTENBERG_BOOK.encode(), IngestOptions())
    assert result.book_id == "sub/tiny.txt"
    assert result.title == "A Tiny Tale of Two Lines"
    assert result.author == "Jane Doe"
    assert kept_texts(result) == [
        "It was a bright cold day in April, and the clocks were striking thirteen.",
        "Mr. Smith walked home slowly.",
        "The second paragraph starts here and it is wrapped over two lines.",
    ]


@pytest.mark.parametrize("start, end", [
    ("***START OF THE PROJECT GUTENBERG EBOOK X***", "***END OF THE PROJECT GUTENBERG EBOOK X***"),
    ("*** START OF THIS PROJECT GUTENBERG EBOOK\nTHE LONG TITLE ***", "End of Project Gutenberg's X, by Y"),
    ("*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*",
     "***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**START***"),
])
def test_marker_variants(start, end):
    header, body = strip_gutenberg_boilerplate(f"Licence blah.\n{start}\n\nThe book itself.\n\n{end}\nMore licence.\n")
    assert header == "Licence blah.\n"
    assert body.strip() == "The book itself."


def test_markers_are_whole_lines_wherever_they_are_in_the_file():
    first_line = ("*** START OF THE PROJECT GUTENBERG EBOOK X ***\nBook.\n"
                  "  *** END OF THE PROJECT GUTENBERG EBOOK X ***\nL.\n")
    assert strip_gutenberg_boilerplate(first_line) == ("", "\nBook.\n")
    mentioned = "He said *** END OF THE PROJECT GUTENBERG EBOOK and left.\nEnd of Project Gutenberg, he said.\n"
    assert strip_gutenberg_boilerplate(mentioned) == ("", mentioned[:mentioned.index("End of")])
    assert strip_gutenberg_boilerplate("Header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***") == ("Header\n", "")


def test_book_without_markers_is_kept_whole_with_file_stem_as_title():
    raw = b"First line of the book is here.\n\nLast line of the book is here.\n"
    result = process_book("dir/no_markers.txt", raw, IngestOptions())
    assert result.title == "no_markers" and result.author == ""
    assert kept_texts(result) == ["First line of the book is here.", "Last line of the book is here."]


def test_reflow_keeps_paragraph_boundaries_and_cleans_whitespace():
    body = "  one  two\nthree\n\n\n four\t five \n  \nsix\x07 seven\n"
    assert split_paragraphs(body) == [["one two", "three"], ["four five"], ["six\x07 seven"]]
    result = process_book("b.txt", body.encode(), IngestOptions(min_tokens=1))
    assert result.sentences == ((0, 0, "one two three"), (1, 1, "four five"), (2, 2, "six seven"))


def test_split_keeps_a_title_that_starts_a_sentence():
    # Blingfire alone gives "He left the house." | "Mr." | "Smith came in." | ...
    paragraph = "He left the house. Mr. Smith came in. I was tired. \u201cDr. Jones is here,\u201d she said."
    assert split_sentences([paragraph]) == [[
        "He left the house.", "Mr. Smith came in.", "I was tired.", "\u201cDr. Jones is here,\u201d she said."]]


def test_one_splitter_call_keeps_paragraphs_apart():
    # A paragraph that ends without punctuation, or with a title, still ends its sentence.
    assert split_sentences(["CHAPTER I", "He met Mr.", "Smith was there. He left."]) == [
        ["CHAPTER I"], ["He met Mr."], ["Smith was there.", "He left."]]


def test_sentence_split_and_length_filter():
    raw = b"Ok. This sentence has exactly six tokens. Mrs. Brown said hello to all.\n"
    result = process_book("b.txt", raw, IngestOptions(min_tokens=2, max_tokens=6))
    assert kept_texts(result) == ["This sentence has exactly six tokens.", "Mrs. Brown said hello to all."]
    assert result.num_dropped_by_length == 1


def test_dropped_paragraphs_leave_dense_indices():
    raw = b"CHAPTER I.\n\nA first real sentence here.\n\n* * *\n\nAnother real sentence here. And one more here.\n"
    result = process_book("b.txt", raw, IngestOptions(min_tokens=4))
    assert [(p, s) for p, s, _ in result.sentences] == [(0, 0), (1, 1), (1, 2)]
    assert result.num_dropped_by_length == 2


def test_sentence_per_line_mode_does_not_resplit():
    raw = b"Mr. Smith went home . He slept .\nSecond sentence of para one .\n\nPara two only sentence .\n"
    result = process_book("s.txt", raw, IngestOptions(input_format="sentence_per_line", min_tokens=1))
    assert result.sentences == (
        (0, 0, "Mr. Smith went home . He slept ."),
        (0, 1, "Second sentence of para one ."),
        (1, 2, "Para two only sentence ."),
    )


def test_nfkc_is_optional():
    raw = "The \ufb01nal o\ufb03ce hours are here.\n".encode()
    assert kept_texts(process_book("n.txt", raw, IngestOptions()))[0] == "The \ufb01nal o\ufb03ce hours are here."
    assert kept_texts(process_book("n.txt", raw, IngestOptions(nfkc=True)))[0] == "The final office hours are here."


@pytest.mark.parametrize("raw, reason", [
    (b"", "empty file"),
    (b" \n\r\n\t", "empty file"),
    (b"PK\x03\x04\x00\x00binary zip data", "binary file (contains NUL bytes: 10% of characters)"),
    ("A sentence saved as UTF-16 without a byte-order mark.".encode("utf-16-le"),
     "binary file (contains NUL bytes: 50% of characters); if it is UTF-16 text without a byte-order mark, save it"),
    (bytes(range(1, 32)) * 20, "binary file"),
    (b"CHAPTER I.\n\nThe End.\n", "zero sentences after filtering"),
    (b"*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\n",
     "no text left"),
])
def test_bad_content_is_rejected_with_a_reason_never_raised(raw, reason):
    result = process_book("bad.txt", raw, IngestOptions())
    assert result.status == "rejected"
    assert result.reason.startswith(reason)
    assert result.sentences == () and result.num_bytes == len(raw)


def test_invalid_options_say_what_to_fix():
    with pytest.raises(ValueError, match="input_format"):
        IngestOptions(input_format="xml")
    with pytest.raises(ValueError, match="data.min_tokens <= data.max_tokens"):
        IngestOptions(min_tokens=10, max_tokens=5)


def test_exact_duplicates_ignore_encoding_wrapping_and_boilerplate():
    prose = "A tale of two cities was here.\nIt was the best of times.\n"
    plain = process_book("a.txt", prose.encode(), IngestOptions())
    rewrapped = b"\xef\xbb\xbfA tale of two\r\ncities was here.   It was the best\r\nof times.\r\n\r\n"
    wrapped = process_book("b.txt", rewrapped, IngestOptions())
    other = process_book("c.txt", b"A different book entirely, it is.\n", IngestOptions())
    assert plain.fingerprint == wrapped.fingerprint == book_fingerprint(["A tale of two cities was here. "
                                                                          "It was the best of times."])
    first_by_fingerprint = {}
    assert [exact_duplicate_of(r, first_by_fingerprint) for r in (plain, other, wrapped)] == [None, None, "a.txt"]
