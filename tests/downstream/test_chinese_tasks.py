"""The built-in Chinese data (issue 41, item 2) from small files the tests write: People's Daily's sentences, the
tasks' splits, BMES tags and the SIGHAN word F1, the poems, and the exclusion of every task's dev and test sentences
from the pretraining corpus."""
import io
import json
import tarfile

import numpy as np
import pytest
import ray

from data_prep.corpus.builtin.peoples_daily import bmes_tags, peoples_daily_paragraphs, peoples_daily_tagging_splits
from data_prep.corpus.builtin.zh_poetry import zh_poetry_documents
from data_prep.corpus.builtin.zh_sentiment import zh_sentiment_rows
from data_prep.corpus.prepare import prepare_corpus
from data_prep.corpus.shards import open_shards
from data_prep.tasks.conll import TaggedSentence
from models import IGNORE_INDEX
from pipeline.corpus import EvaluationSources, decontamination, evaluation_texts
from pipeline.downstream.finetune import finetune_settings, scored_tasks
from pipeline.downstream.task_data import conll_sentences, majority_tag_scores, tsv_splits
from pipeline.downstream.tasks import load_task
from pipeline.evaluation.metrics import segmentation_words, word_f1
from tests.helpers import tiny_config

PEOPLES_DAILY = ("迈向/v  充满/v  希望/n  的/u  新/a  世纪/n  。/w  他/r  说/v  ：/w  “/w  好/a  。/w  ”/w  "
                 "１２月/t  ３１日/t  ，/w  记者/n  兰/nr  红光/nr  摄/Vg\n"
                 "同胞/n  们/k  、/w  朋友/n  们/k  ！/w\n")


def test_peoples_daily_lines_become_sentences_of_tagged_words_cut_after_their_closing_quote():
    paragraphs = peoples_daily_paragraphs(PEOPLES_DAILY)
    assert [[s.text for s in p] for p in paragraphs] == [
        ["迈向充满希望的新世纪。", "他说：“好。”", "１２月３１日，记者兰红光摄"], ["同胞们、朋友们！"]]
    assert paragraphs[0][1].tags == ("r", "v", "w", "w", "a", "w", "w")


def test_bmes_tags_of_a_segmented_sentence():
    assert bmes_tags(("迈向", "的", "一九九八年")) == [("迈", "B"), ("向", "E"), ("的", "S"), ("一", "B"), ("九", "M"),
                                                  ("九", "M"), ("八", "M"), ("年", "E")]


def test_word_f1_is_the_sighan_scorers_by_hand():
    # gold 他/来到/了/网易/杭研/大厦 (6 words), predicted 他/来/到/了/网易/杭研大厦 (6 words): 他, 了 and 网易 are
    # right, at the same characters -> P = 3/6, R = 3/6, F = 0.5
    gold = [tag for _, tag in bmes_tags(("他", "来到", "了", "网易", "杭研", "大厦"))]
    predicted = [tag for _, tag in bmes_tags(("他", "来", "到", "了", "网易", "杭研大厦"))]
    assert word_f1([predicted], [gold]) == {"precision": 0.5, "recall": 0.5, "f1": 0.5}
    # over two sentences together, not averaged per sentence: the second's 2 of 2 right give 5/8 both ways
    assert word_f1([predicted, list("SBE")], [gold, list("SBE")])["f1"] == pytest.approx(5 / 8)
    # a sequence that is no valid BMES is read as words all the same: B B, M after S, an untagged character
    assert segmentation_words(["B", "B", "E", "S", "M", "E", "O"]) == {(0, 0), (1, 2), (3, 3), (4, 5), (6, 6)}


def test_the_sentiment_reviews_are_deduplicated_before_the_split_and_the_splits_are_disjoint():
    positive = "\n".join(["好书 ", "好书", "非常好看", "值得一读", "两边都有"] + [f"好评{i}" for i in range(40)])
    negative = "\n".join(["很差", "很差", "两边都有"] + [f"差评{i}" for i in range(40)])
    splits = zh_sentiment_rows(positive, negative)
    rows = [row for split in splits.values() for row in split]
    assert len(rows) == len({review for review, _ in rows}) == 3 + 40 + 1 + 40  # 好书 once, 两边都有 dropped
    assert [len(splits[name]) for name in ("train", "dev", "test")] == [67, 8, 9]
    assert dict(rows)["好书"] == "1" and dict(rows)["很差"] == "0"
    assert zh_sentiment_rows(positive, negative) == splits  # the fixed seed


def test_the_tagging_tasks_split_distinct_sentences_once():
    text = "\n".join(f"第/m  {i}/m  句/q  。/w  重复/v  。/w" for i in range(200))
    splits = peoples_daily_tagging_splits(text)
    assert [len(splits[name]) for name in ("train", "dev", "test")] == [181, 10, 10]  # "重复。" counted once
    seen = [s.words for split in splits.values() for s in split]
    assert len(seen) == len(set(seen))


def test_the_poems_are_read_from_the_npm_tarball_without_its_error_folder(tmp_path):
    package = tmp_path / "chinese-poetry-2.0.1.tgz"
    poems = [{"author": "李白", "paragraphs": ["床前明月光，", "疑是地上霜。"], "title": "靜夜思"},
             {"author": "無名", "paragraphs": [], "title": "空"}]
    with tarfile.open(package, "w:gz") as tar:
        for name in ("package/dist/quantangshi/poet.tang.0.json", "package/dist/quantangshi/error/poet.tang.0.json",
                     "package/dist/songci/ci.song.1000.json", "package/dist/rank/poet/poet.tang.0.json"):
            data = json.dumps(poems, ensure_ascii=False).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert zh_poetry_documents(package) == {"poet.tang.0": ["床前明月光，疑是地上霜。"],
                                            "ci.song.1000": ["床前明月光，疑是地上霜。"]}


def test_the_majority_baseline_of_a_tagging_task_tags_each_word_with_its_most_frequent_tag():
    task = load_task("zh_pos")
    train = [TaggedSentence(["我", "爱", "北京"], ["r", "v", "ns"]), TaggedSentence(["爱", "国"], ["vn", "n"]),
             TaggedSentence(["爱"], ["v"])]
    dev = [TaggedSentence(["我", "爱", "天津"], ["r", "v", "ns"])]  # 天津 unseen: train's most frequent tag, v
    assert majority_tag_scores(task, train, dev) == {"accuracy": pytest.approx(2 / 3)}


def write_zh_tasks(root):
    """Small files of zh_sentiment (TSV) and zh_pos (CoNLL), with dev and test splits."""
    root.mkdir()
    for split, reviews in (("train", ["这本书很好看。", "质量太差了。"]), ("dev", ["物流很快，包装也好，推荐购买。"]),
                           ("test", ["客服态度恶劣，再也不来这家店了。"])):
        (root / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{r}\t1\n" for r in reviews))
    for split, words in (("train", ["我们", "爱", "和平"]),
                         ("dev", ["国务院", "总理", "今天", "会见", "了", "外国", "客人"]),
                         ("test", ["人民", "大会堂", "举行", "了", "隆重", "的", "新年", "茶话会"])):
        (root / f"pos_{split}.txt").write_text("".join(f"{w} n\n" for w in words) + "\n")


@pytest.fixture(scope="module")
def ray_running():
    if ray.is_initialized():
        yield
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield
        ray.shutdown()


def test_the_pretraining_corpus_loses_the_tasks_dev_and_test_sentences(tmp_path, ray_running):
    write_zh_tasks(tmp_path / "zh")
    cfg = tiny_config(tmp_path, ["finetune.task=[zh_sentiment,zh_pos]", f"finetune.data_dir={tmp_path / 'zh'}"])
    texts = evaluation_texts(EvaluationSources.of(cfg))
    assert list(texts) == ["zh_sentiment dev", "zh_sentiment test", "zh_pos dev", "zh_pos test"]
    assert texts["zh_pos test"] == ["人民 大会堂 举行 了 隆重 的 新年 茶话会"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "news.txt").write_text("今天天气很好。国务院总理今天会见了外国客人。人民大会堂举行了隆重的新年茶话会！"
                                     "我们爱和平。\n\n客服态度恶劣，再也不来这家店了。这本书很好看。\n")
    manifest = prepare_corpus(corpus, tmp_path / "out", num_workers=1, min_tokens=2, near_duplicates=None,
                              decontamination=decontamination(cfg.data, EvaluationSources.of(cfg)))
    kept = ["今天天气很好。", "我们爱和平。", "这本书很好看。"]  # train text stays
    assert open_shards(tmp_path / "out").column("text").to_pylist() == kept
    assert manifest["decontamination"]["sentences_removed_by_source"] == {
        "zh_sentiment dev": 0, "zh_sentiment test": 1, "zh_pos dev": 1, "zh_pos test": 1}


def test_gpt_tags_each_word_at_its_last_token(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pipeline.gpt.downstream import tagging_features

    vocab = {"[UNK]": 0, "我": 1, "们": 2, "爱": 3, "北": 4, "京": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    sentence = TaggedSentence(["我们", "爱", "北京"], ["r", "v", "ns"])
    feature = tagging_features(tokenizer, [sentence], ["r", "v", "ns"], max_len=16, end_id=6)[0]
    assert feature["input_ids"].tolist() == [1, 2, 3, 4, 5, 6]
    # 我们 at 们 (position 1), 爱 at 爱 (2), 北京 at 京 (4); the model reads each there and at the token after
    assert feature["word_ids"].tolist() == [-1, 0, 1, -1, 2, -1]
    assert feature["labels"].tolist() == [IGNORE_INDEX, 0, 1, IGNORE_INDEX, 2, IGNORE_INDEX]
    cut = tagging_features(tokenizer, [sentence], ["r", "v", "ns"], max_len=4, end_id=6)[0]
    assert cut["input_ids"].tolist() == [1, 2, 3, 6] and cut["word_ids"].tolist() == [-1, 0, 1, -1]  # 北京 cut
    cut = tagging_features(tokenizer, [sentence], ["r", "v", "ns"], max_len=5, end_id=6)[0]
    assert cut["input_ids"].tolist() == [1, 2, 3, 4, 6] and cut["word_ids"].tolist() == [-1, 0, 1, -1, -1]  # half
    assert np.all(feature["token_type_ids"] == 0)


# A hard-wrapped bilingual book, as a Chinese user's own would be: Chinese paragraphs wrapped mid-word, English ones
# mid-sentence, a dialogue line with closing quotes, a one-character heading, and a paragraph in traditional script
MIXED_BOOK = """第一章

北京是中华人民共和国的首都，也是全国的政治、文化中
心。这座城市有三千多年的建城史！你去过故宫吗？
他笑着说：“当然去过。”然后又补充道……
“明年我们一起再去吧！”

Beijing is the capital of the People's Republic of China. It has
been a capital for more than eight centuries. Mr. Wang lives there
with his family.

他喜欢用 Python 写程序，也喜欢读 English novels。周末他常去
图书馆；有时也去公园散步。

這是一段繁體中文的文字，說明轉換的作用。
"""
MIXED_BOOK_SENTENCES = [
    "第一章", "北京是中华人民共和国的首都，也是全国的政治、文化中心。", "这座城市有三千多年的建城史！",
    "你去过故宫吗？", "他笑着说：“当然去过。”", "然后又补充道……", "“明年我们一起再去吧！”",
    "Beijing is the capital of the People's Republic of China.",
    "It has been a capital for more than eight centuries.", "Mr. Wang lives there with his family.",
    "他喜欢用 Python 写程序，也喜欢读 English novels。", "周末他常去图书馆；", "有时也去公园散步。",
    "这是一段繁体中文的文字，说明转换的作用。"]


def test_a_mixed_chinese_and_english_book_through_prepare(tmp_path, ray_running):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "mixed.txt").write_text(MIXED_BOOK, encoding="utf-8")
    manifest = prepare_corpus(corpus, tmp_path / "out", num_workers=1, near_duplicates=None,
                              chinese_variant="simplified")
    assert open_shards(tmp_path / "out").column("text").to_pylist() == MIXED_BOOK_SENTENCES
    (book,) = manifest["files"]
    # 第一章 (3 characters) is kept as a sentence of 3 tokens; nothing is too long
    assert (book["status"], book["sentences"], manifest["options"]["chinese_variant"]) == ("kept", 14, "simplified")


def write_traditional_zh_tasks(root):
    """zh_sentiment and zh_pos written in traditional characters, as a user's task from Taiwan or Hong Kong would be,
    with the full-width digits and punctuation NFKC folds."""
    root.mkdir()
    for split, reviews in (("train", ["這本書很好看。", "質量太差了。"]), ("dev", ["物流很快，包裝也好，推薦購買。"]),
                           ("test", ["客服態度惡劣，再也不來這家店了１２次。"])):
        (root / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{r}\t1\n" for r in reviews))
    for split, words in (("train", ["我們", "愛", "和平"]), ("dev", ["國務院", "總理", "會見", "了"]),
                         ("test", ["人民", "大會堂", "舉行", "了"])):
        (root / f"pos_{split}.txt").write_text("".join(f"{w} n\n" for w in words) + "\n")


def test_a_task_is_read_in_the_script_and_unicode_form_prepare_gave_the_corpus(tmp_path):
    write_traditional_zh_tasks(tmp_path / "zh")
    overrides = ["finetune.task=[zh_sentiment,zh_pos]", f"finetune.data_dir={tmp_path / 'zh'}"]
    as_it_is = tiny_config(tmp_path, overrides)
    converted = tiny_config(tmp_path, [*overrides, "data.chinese_variant=simplified", "data.nfkc=true"])
    f = finetune_settings(converted)
    sentiment, pos = scored_tasks(converted, f)
    train, dev, _ = tsv_splits(sentiment, tmp_path / "zh", None, 0)
    assert train.texts_a == ["这本书很好看。", "质量太差了。"] and dev.texts_a == ["物流很快,包装也好,推荐购买。"]
    assert [s.tokens for s in conll_sentences(pos, tmp_path / "zh", pos.dev_file)] == [["国务院", "总理", "会见", "了"]]
    # a run that reads its corpus as it is reads its tasks as they are (the English default: no conversion at all)
    sentiment_as_it_is = scored_tasks(as_it_is, finetune_settings(as_it_is))[0]
    assert "text_form" not in sentiment_as_it_is
    assert tsv_splits(sentiment_as_it_is, tmp_path / "zh", None, 0)[1].texts_a == ["物流很快，包裝也好，推薦購買。"]
    # decontamination compares the tasks' text in the corpus's form: the traditional test review is found in a corpus
    # that prepare converted to simplified characters, with NFKC's ASCII digits and comma
    texts = evaluation_texts(EvaluationSources.of(converted))
    assert texts["zh_sentiment test"] == ["客服态度恶劣,再也不来这家店了12次。"]


def test_the_chinese_experiments_read_their_tasks_in_the_corpus_script(tmp_path):
    """zh_builtin is in simplified characters: the Chinese experiments convert every text to them, the tasks' too."""
    cfg = tiny_config(tmp_path, experiment="bert_tiny_zh")
    assert cfg.data.chinese_variant == "simplified"
    assert all(task.text_form.chinese_variant == "simplified" for task in scored_tasks(cfg, finetune_settings(cfg)))
