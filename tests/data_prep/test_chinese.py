"""Chinese and mixed Chinese/English text through every data stage (issue 41): sentences, re-flow, length filters,
near-duplicate shingles, decontamination, WordPiece, the word-level families' words, script conversion."""
from collections import Counter

import numpy as np
import pytest

from data_prep.corpus.chinese import (
    convert_variant,
    count_tokens,
    join_wrapped_lines,
    segment_chinese,
    split_chinese_sentences,
)
from data_prep.corpus.decontaminate import EvaluationOverlap, normalised_words
from data_prep.corpus.dedup import MinHasher, NearDuplicateOptions, draw_minhasher, minhash_signature, shingle_hashes
from data_prep.corpus.ingest import IngestOptions, process_book, reflow_paragraphs
from data_prep.corpus.sentences import split_sentences
from data_prep.corpus.tokenizer import UNK_ID, train_wordpiece, unknown_rate_summary, unknown_tokens
from data_prep.examples.elmo_examples import books_from_rows, count_words, elmo_words
from data_prep.examples.skip_thought_examples import build_word_vocab
from data_prep.examples.skip_thought_examples import count_words as skip_thought_count_words
from data_prep.examples.skip_thought_examples import tokenize as skip_thought_tokenize
from data_prep.tasks.senteval_data import tokenize as senteval_tokenize

MIXED = ("他说：“我们走吧。”然后离开了……你好！真的吗?是的；不。 Mr. Smith arrived at 5 p.m. today. "
         "He said hello. 我很好。")
MIXED_SENTENCES = ["他说：“我们走吧。”", "然后离开了……", "你好！", "真的吗?", "是的；", "不。",
                   "Mr. Smith arrived at 5 p.m. today.", "He said hello.", "我很好。"]


@pytest.mark.parametrize("splitter", ["blingfire", "nupunkt"])
def test_chinese_sentences_end_at_their_marks_with_their_closing_quotes_and_english_is_split_as_before(splitter):
    # blingfire alone: "他说：“我们走吧。" | "”然后离开了……你好！真的吗?是的；不。" (the quote on the next sentence, and
    # neither ！ nor ； nor … ends one); a Chinese paragraph was one sentence up to data.max_tokens
    assert split_sentences([MIXED, "Plain English. Second one."], splitter) == [
        MIXED_SENTENCES, ["Plain English.", "Second one."]]
    assert split_chinese_sentences("（注：见第三章。）下文……，接着说「好。」") == [
        "（注：见第三章。）", "下文……，接着说「好。」"]


def test_reflow_joins_wrapped_chinese_lines_without_a_space_and_latin_words_with_one():
    body = ("我们今天去北\n京，看了天安门。This is a\nwrapped line, 中文\nEnglish mix，\n“引号”\n与（括号）\n\n"
            "第二段\n  的文字。")
    assert reflow_paragraphs(body) == [
        "我们今天去北京，看了天安门。This is a wrapped line, 中文 English mix，“引号”与（括号）", "第二段的文字。"]
    assert join_wrapped_lines("a\nb") == "a\nb"  # Latin line breaks are collapse_whitespace's to turn into spaces


def test_length_filters_count_each_chinese_character_as_a_token():
    assert count_tokens("我爱Python。") == 3 and count_tokens("好的。") == 3 and count_tokens("two words") == 2
    book = "他走了。好。今天的天气非常好，我们去公园散步吧！\n\nShort. A sentence of English words here.\n"
    result = process_book("zh.txt", book.encode(), IngestOptions(min_tokens=3, max_tokens=15))
    # 好。 is 2 tokens (too short), the 18 of the exclamation too many; whitespace counting had dropped them all
    assert [text for _, _, text in result.sentences] == ["他走了。", "A sentence of English words here."]
    assert (result.num_dropped_too_short, result.num_dropped_too_long) == (2, 1)


def test_near_duplicate_shingles_of_chinese_text_are_character_ngrams():
    text = "我们今天去北京，看了天安门。"  # 12 characters, the comma and stop break nothing but words
    assert len(shingle_hashes([text], 5)) == 12 - 5 + 1
    assert len(shingle_hashes(["一二三 four five"], 1)) == 5
    np.testing.assert_array_equal(shingle_hashes(["the quick brown fox jumps over"], 5),
                                  shingle_hashes(["The quick, brown fox — jumps over"], 5))  # English as before
    rng = np.random.default_rng(0)
    characters = list("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发"
                      "年动同工也能下过子说产种面")
    book = "".join(rng.choice(characters, 3000))
    edited = book[:1000] + "新加的几个字" + book[1000:2500] + book[2600:]
    other = "".join(rng.choice(characters, 3000))
    hasher: MinHasher = draw_minhasher(NearDuplicateOptions().num_perm, np.random.default_rng(1))

    def similarity(a: str, b: str) -> float:
        sa, sb = (minhash_signature(shingle_hashes([t], 5), hasher) for t in (a, b))
        return float(np.mean(sa == sb))
    # as one shingle per paragraph the edited copy had nothing in common with the book
    assert similarity(book, edited) > 0.8 > 0.1 > similarity(book, other)


def test_decontamination_counts_chinese_characters_as_words():
    assert normalised_words("我们去北京，iPhone 15。") == ["我", "们", "去", "北", "京", "iphone", "15"]
    dev = "国务院总理李鹏今天在人民大会堂会见了来访的客人"
    overlap = EvaluationOverlap.build({"zh dev": [dev]}, n=13)
    corpus = ["今天天气很好。", "据报道，" + dev[2:15] + "，随后举行了会谈。", "总理李鹏今天在人民大会堂。", dev + "。"]
    # a 13-character span of the dev sentence, and the whole sentence; 12 characters of it are not enough
    assert overlap.overlapping(corpus)[0].tolist() == [False, True, False, True]


def test_wordpiece_makes_each_chinese_character_a_word_and_keeps_every_character_of_the_corpus(tmp_path):
    rng = np.random.default_rng(0)
    characters = [chr(c) for c in range(0x4E00, 0x4E00 + 1500)]  # more characters than HF's default alphabet of 1,000
    sentences = ["".join(rng.choice(characters, 30)) + " and some english words" for _ in range(300)]
    tokenizer = train_wordpiece(sentences, tmp_path / "all", vocab_size=3000, min_frequency=2)
    a, b, c, d = characters[:4]
    pieces = tokenizer.encode(f"{a}{b}and English{c}{d}", add_special_tokens=False).tokens
    assert pieces[:2] == [a, b] and pieces[-2:] == [c, d]  # no "##" piece of a CJK character
    assert unknown_tokens(tokenizer, sentences)[0] == 0
    limited = train_wordpiece(sentences, tmp_path / "limited", vocab_size=3000, min_frequency=2, limit_alphabet=1000)
    unknown, total = unknown_tokens(limited, sentences)
    assert unknown > 0 and limited.encode("".join(characters)).ids.count(UNK_ID) >= 500


def test_a_wordpiece_unknown_rate_above_half_a_percent_is_warned_about(capsys):
    assert unknown_rate_summary(6, 1000, "tokenizer.vocab_size", warn_above=0.005)["unknown_rate_warning"]
    assert unknown_rate_summary(4, 1000, "tokenizer.vocab_size", warn_above=0.005)["unknown_rate_warning"] is None
    assert "WARNING" in capsys.readouterr().out


def test_word_level_families_split_chinese_into_words_by_jieba_or_characters():
    text = "我爱北京天安门, and I love Beijing."
    assert segment_chinese(text) == " 我 爱 北京 天安门 , and I love Beijing."
    assert segment_chinese(text, "characters").split()[:7] == ["我", "爱", "北", "京", "天", "安", "门"]
    assert segment_chinese("no chinese here") == "no chinese here"
    assert elmo_words(text) == ["我", "爱", "北京", "天安门", ",", "and", "I", "love", "Beijing", "."]
    assert skip_thought_tokenize(text)[:4] == ["我", "爱", "北京", "天安门"]
    assert senteval_tokenize(text, "characters")[:4] == ["我", "爱", "北", "京"]
    assert count_words([text, "北京"])["北京"] == 2 and count_words([text], "characters")["京"] == 1
    assert [book for book, _ in books_from_rows(["a", "a", "b"], ["北京", "你好", "x"])] == ["a", "b"]
    vocab = build_word_vocab(skip_thought_count_words([text, "北京欢迎你"]), 100, chinese_words="jieba")
    assert vocab.encode("北京欢迎你")[0] == vocab.index["北京"]
    with pytest.raises(ValueError, match="data.chinese_words='words' is not one of"):
        segment_chinese("中文", "words")


def test_traditional_and_simplified_are_converted_by_opencc_when_asked():
    traditional = "秦川雄帝宅，函谷壯皇居。綺殿千尋起，離宮百雉餘。"
    assert convert_variant(traditional, "simplified") == "秦川雄帝宅，函谷壮皇居。绮殿千寻起，离宫百雉余。"
    assert convert_variant("汉语简体", "traditional") == "漢語簡體"
    assert convert_variant(traditional, "keep") == traditional
    book = (traditional + "\n\nAn English line, kept as it is.\n").encode()
    kept = process_book("poem.txt", book, IngestOptions(min_tokens=2, chinese_variant="simplified"))
    assert [text for _, _, text in kept.sentences] == ["秦川雄帝宅，函谷壮皇居。", "绮殿千寻起，离宫百雉余。",
                                                       "An English line, kept as it is."]
    with pytest.raises(ValueError, match="data.chinese_variant='hk'"):
        IngestOptions(chinese_variant="hk")


def test_counts_of_a_mixed_book_split_by_the_pipeline_are_of_its_words():
    counts = Counter(w for s in MIXED_SENTENCES for w in elmo_words(s))
    assert counts["我们"] == 1 and counts["Smith"] == 1 and "我们走吧" not in counts
