"""Bad task files fail in `load_task_data`, before any training, with an error naming the file and the line (or the
SQuAD question id) and saying what is wrong. Each case starts from files that load, then breaks one thing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_prep.corpus.tokenizer import train_wordpiece
from pipeline.bert.downstream import load_task_data
from pipeline.downstream.tasks import load_task, scored_task
from pipeline.runner import validate
from tests.helpers import tiny_config

CONTEXT = "The Seine flows through Paris."


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    words = ["the seine flows through paris", "a fine film", "a dull film", "peter went to london"]
    return train_wordpiece(words, tmp_path_factory.mktemp("tok"), vocab_size=120, min_frequency=1)


def _write_sst2(root: Path) -> None:
    for name in ("train.tsv", "dev.tsv"):
        (root / name).write_text("sentence\tlabel\na fine film\t1\na dull film\t0\n")


def _write_conll(root: Path) -> None:
    for name in ("eng.train", "eng.testa"):
        (root / name).write_text("-DOCSTART- -X- -X- O\n\nPeter NNP B-NP I-PER\nwent VBD B-VP O\n\n"
                                 "to TO B-PP O\nLondon NNP B-NP I-LOC\n")


def _squad(answer_start: int) -> str:
    return json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "q-river", "question": "Which river?", "answers": [{"text": "The Seine", "answer_start": answer_start}]}
    ]}]}]})


def _write_squad(root: Path) -> None:
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (root / name).write_text(_squad(0))


VALID = {"sst2": _write_sst2, "conll2003": _write_conll, "squad_v1": _write_squad}


def _load(task_name: str, root: Path, tok):
    # 192: room for SQuAD's doc_stride of 128 context tokens beside the question
    return load_task_data(load_task(task_name), root, tok, max_seq_length=192, max_train_examples=None, seed=0)


@pytest.mark.parametrize("task_name", list(VALID))
def test_the_valid_fixtures_load(task_name, tmp_path, tok):
    VALID[task_name](tmp_path)
    data = _load(task_name, tmp_path, tok)
    assert len(data.train) >= 1 and len(data.dev) >= 1


CASES = [
    # (task, file, broken content, what the error must say)
    pytest.param("sst2", "dev.tsv", "text\tlabel\na fine film\t1\n",
                 r"dev\.tsv:1: missing column\(s\) \['sentence'\]; header has \['text', 'label'\]\. "
                 r".*tasks/sst2\.yaml", id="tsv-missing-column"),
    pytest.param("sst2", "train.tsv", "sentence\tlabel\na fine film\t1\na dull film\tnegative\n",
                 r"train\.tsv:3: unknown label 'negative'; task sst2 has labels \['0', '1'\]", id="tsv-unknown-label"),
    pytest.param("sst2", "train.tsv", "sentence\tlabel\na fine film\t1\na dull\tfilm\t0\n",
                 r"train\.tsv:3: expected 2 tab-separated fields, as on the file's header, got 3",
                 id="tsv-extra-field"),
    pytest.param("sst2", "dev.tsv", "sentence\tlabel\n", r"dev\.tsv: no examples after the header",
                 id="tsv-empty-split"),
    pytest.param("sst2", "train.tsv", "", r"train\.tsv: empty file, expected a header row", id="tsv-empty-file"),
    pytest.param("conll2003", "eng.train", "Peter NNP B-NP I-PER\nwent O\n",
                 r"eng\.train:2: expected 4 space-separated columns .* got 2", id="conll-malformed-line"),
    pytest.param("conll2003", "eng.testa", "Peter NNP B-NP PERSON\n", r"eng\.testa:1: tag 'PERSON' is not IOB",
                 id="conll-tag-not-iob"),
    pytest.param("conll2003", "eng.testa", "-DOCSTART- -X- -X- O\n\n", r"eng\.testa: no tagged words",
                 id="conll-empty-split"),
    pytest.param("conll2003", "eng.testa", "Peter NNP B-NP I-PER\nParis NNP B-NP I-CITY\n",
                 r"eng\.testa:2: tag 'I-CITY' is not one of the task's labels", id="conll-unknown-label"),
    pytest.param("squad_v1", "dev-v1.1.json", _squad(4),
                 r"dev-v1\.1\.json: question q-river: answer 'The Seine' is not at answer_start 4 .*found 'Seine fl",
                 id="squad-answer-start"),
    pytest.param("squad_v1", "train-v1.1.json", json.dumps({"version": "1.1", "data": []}),
                 r"train-v1\.1\.json: no questions in the file", id="squad-empty-split"),
]


@pytest.mark.parametrize("task_name,file_name,content,message", CASES)
def test_bad_task_file_names_file_and_line(task_name, file_name, content, message, tmp_path, tok):
    VALID[task_name](tmp_path)
    (tmp_path / file_name).write_text(content)
    with pytest.raises(ValueError, match=message):
        _load(task_name, tmp_path, tok)


def test_missing_task_file_says_which_directory_and_files_are_expected(tmp_path, tok):
    _write_sst2(tmp_path)
    (tmp_path / "dev.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"task sst2: .*dev\.tsv not found; finetune\.data_dir \(or its SST-2 "
                                                r"subdirectory\) should hold train\.tsv and dev\.tsv"):
        _load("sst2", tmp_path, tok)


def test_score_split_test_reads_the_test_file_where_dev_was_read():
    task = load_task("bbc_headlines")
    assert scored_task(task, "dev") is task
    scored = scored_task(task, "test")
    assert scored.dev_file == task.test_file == "test.tsv" and scored.train_file == task.train_file


def test_score_split_test_of_a_task_without_a_test_split_fails_before_any_work(tmp_path):
    cfg = tiny_config(tmp_path, ["finetune.score_split=test"])  # the tiny runs fine-tune on sst2: train and dev only
    with pytest.raises(ValueError, match="task sst2 has no test split .*score it on dev"):
        validate(cfg)
    cfg = tiny_config(tmp_path, ["finetune.task=bbc_headlines", "finetune.models=[]", "finetune.baselines=[lead_n]",
                                 "finetune.score_split=test", "finetune.selection_fraction=0.1"])
    with pytest.raises(ValueError, match="selection_fraction .*score_split=test the test split: set one of them"):
        validate(cfg)
    with pytest.raises(Exception, match="score_split"):
        tiny_config(tmp_path, ["finetune.score_split=train"])  # the schema's enum, at composition


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
@pytest.mark.parametrize("task_name, file_name, word, line", [
    ("sst2", "dev.tsv", "dull", 3), ("conll2003", "eng.testa", "London", 7), ("squad_v1", "dev-v1.1.json", "Paris", 1)])
def test_a_task_file_not_in_utf8_names_file_and_line(task_name, file_name, word, line, encoding, tmp_path, tok):
    """A Latin-1 or UTF-16 file failed with the decoder's error, naming neither file nor line."""
    VALID[task_name](tmp_path)
    path = tmp_path / file_name
    path.write_bytes(path.read_text().replace(word, f"{word}é", 1).encode(encoding))
    kind = (r"UTF-16 \(it starts with a UTF-16 byte-order mark\)" if encoding == "utf-16"
            else r"in another encoding \(byte 0xe9 is not UTF-8; Latin-1 or Windows-1252\?\)")
    with pytest.raises(ValueError, match=rf"{file_name}:{1 if encoding == 'utf-16' else line}: the file is {kind}; "
                                         r"save it as UTF-8"):
        _load(task_name, tmp_path, tok)


def test_a_text_of_a_megabyte_and_a_squad_file_with_a_byte_order_mark_are_read(tmp_path, tok):
    """csv's field limit (131,072 characters) refused the long text with `field larger than field
    limit`, naming no file; json refused the byte-order mark that the TSV readers accept."""
    _write_sst2(tmp_path)
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "a fine film " * 90_000 + "\t1\na dull film\t0\n")
    assert len(_load("sst2", tmp_path, tok).train) == 2
    _write_squad(tmp_path)
    (tmp_path / "dev-v1.1.json").write_text("\ufeff" + _squad(0), encoding="utf-8")
    assert len(_load("squad_v1", tmp_path, tok).dev) >= 1
