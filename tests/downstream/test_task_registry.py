"""Every task YAML in tasks/ reads a tiny fixture written in that task's own file layout."""
import json
import re

import pytest

from data_prep.tasks.conll import iob1_to_iob2
from data_prep.tasks.squad import read_squad
from pipeline.downstream.task_data import conll_sentences
from pipeline.downstream.tasks import available_tasks, load_task, read_split
from pipeline.evaluation.metrics import METRICS


def _write_tsv(task, path, n: int = 6) -> list:
    """n examples in the task's column layout, with an extra column so that columns are found by name or index and
    not by position; returns the labels read_split should give back."""
    headerless = not task.get("header", True)
    columns = [c for c in (task.text_a, task.text_b, task.label) if c is not None]
    layout = list(range(max(columns) + 1)) if headerless else ["index", *columns]
    lines = [] if headerless else ["\t".join(layout)]
    expected = []
    for i in range(n):
        if task.labels is None:
            label_text, label = f"{i * 0.75:.3f}", i * 0.75
        else:
            label = i % len(task.labels)
            label_text = str(task.labels[label])
        values = {task.text_a: f"first sentence {i}", task.label: label_text}
        if task.text_b is not None:
            values[task.text_b] = f"second sentence {i}"
        lines.append("\t".join(values.get(column, f"extra {column}") for column in layout))
        expected.append(label)
    path.write_text("\n".join(lines) + "\n")
    return expected


def _write_conll(task, path) -> list[list[str]]:
    """Two sentences with the word and the tag in the task's columns and "-X-" in the others, so that a reader taking
    another column reads tags outside the task's labels; returns the written tags."""
    tags = [t for t in task.labels if t != "O"]
    sentences = [[("Peter", tags[0]), ("went", task.labels[0])], [("to", task.labels[0]), ("Paris", tags[-1])]]

    def line(word, tag):
        fields = ["-X-"] * 4
        fields[task.get("word_column", 0)], fields[task.get("tag_column", -1)] = word, tag
        return " ".join(fields)

    path.write_text("-DOCSTART- -X- -X- O\n\n" + "\n\n".join(
        "\n".join(line(word, tag) for word, tag in sentence) for sentence in sentences) + "\n")
    return [[tag for _, tag in sentence] for sentence in sentences]


def _write_squad(task, path) -> list[str]:
    context = "The Seine flows through Paris."
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{
        "context": context, "qas": [{"id": "q1", "question": "Which river?",
                                     "answers": [{"text": "The Seine", "answer_start": 0}]}]}]}]}))
    return ["The Seine"]


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in available_tasks()])
def test_task_yaml_names_a_known_format_and_metric(name):
    task = load_task(name)
    assert task.name == name
    assert task.format in {"tsv", "conll", "squad", "seq2seq"}
    assert task.metric in METRICS
    assert task.train_file and task.dev_file and task.train_file != task.dev_file


@pytest.mark.parametrize("name", available_tasks())
def test_task_reads_a_fixture_in_its_layout(name, tmp_path):
    task = load_task(name)
    path = tmp_path / task.dev_file
    if task.format == "tsv":
        expected = _write_tsv(task, path)
        split = read_split(task, path)
        assert split.labels == pytest.approx(expected)
        assert split.texts_a == [f"first sentence {i}" for i in range(len(expected))]
        if task.text_b is None:
            assert split.texts_b is None
        else:
            assert split.texts_b == [f"second sentence {i}" for i in range(len(expected))]
    elif task.format == "seq2seq":
        sources = [f"the article {i} , in words" for i in range(4)]
        targets = [f"headline {i}" for i in range(4)]
        path.write_text("\n".join(["index\textra\t" + "\t".join((task.label, task.text_a))]
                                  + [f"{i}\tx\t{t}\t{src}" for i, (src, t) in enumerate(zip(sources, targets))]) + "\n")
        split = read_split(task, path)
        assert split.texts_a == sources and split.labels == targets  # the target is read as text, not as a label id
        assert split.texts_b is None
    elif task.format == "conll":
        expected = _write_conll(task, path)
        sentences = conll_sentences(task, tmp_path, task.dev_file)
        assert [s.tokens for s in sentences] == [["Peter", "went"], ["to", "Paris"]]
        if task.get("tag_scheme", "iob") == "iob":
            expected = [iob1_to_iob2(tags) for tags in expected]
        assert [s.tags for s in sentences] == expected
        assert {t for s in sentences for t in s.tags} <= set(task.labels)
        assert task.metric in {"entity_f1", "token_accuracy", "word_f1"}
    else:
        assert task.format == "squad", task.format
        expected = _write_squad(task, path)
        assert [e.answers[0] for e in read_squad(path)] == expected


def test_mrpc_header_with_byte_order_mark(tmp_path):
    """GLUE's MRPC files start with a UTF-8 byte-order mark before the 'Quality' column name."""
    path = tmp_path / "dev.tsv"
    path.write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t10\t11\tHe left .\tHe went away .\n",
                    encoding="utf-8")
    split = read_split(load_task("mrpc"), path)
    assert (split.texts_a, split.texts_b, split.labels) == (["He left ."], ["He went away ."], [1])


def test_regression_label_that_is_not_a_number_names_file_and_line(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence1\tsentence2\tscore\na\tb\t4.5\nc\td\tfive\n")
    with pytest.raises(ValueError, match=r"dev.tsv:3: label 'five' is not a number"):
        read_split(load_task("stsb"), path)


@pytest.mark.parametrize("label", ["nan", "NaN", "inf", "-Infinity"])
def test_a_regression_label_that_is_not_finite_names_file_and_line(tmp_path, label):
    """float() read 'nan' and 'inf', and fine-tuning then failed blaming finetune.lr."""
    path = tmp_path / "dev.tsv"
    path.write_text(f"sentence1\tsentence2\tscore\na\tb\t4.5\nc\td\t{label}\n")
    with pytest.raises(ValueError, match=rf"dev.tsv:3: label '{label}' is not a finite number; task stsb is a "
                                         r"regression task \(labels: null\): give the row its score, or remove it"):
        read_split(load_task("stsb"), path)


@pytest.mark.parametrize("second_row, fields", [("gj04\t0", 2), ("gj04\t0\t\tBad sentence .\tstray", 5)])
def test_headerless_row_of_another_width_names_file_and_line(tmp_path, second_row, fields):
    path = tmp_path / "dev.tsv"
    path.write_text(f"gj04\t1\t\tGood sentence .\n{second_row}\n")
    with pytest.raises(ValueError, match=rf"dev.tsv:2: expected 4 tab-separated fields, as on the file's first line, "
                                         rf"got {fields}"):
        read_split(load_task("cola"), path)


def test_headerless_first_row_without_the_task_columns_names_file_and_line(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("gj04\t1\tGood sentence .\n")
    with pytest.raises(ValueError, match=r"dev.tsv:1: expected 4 tab-separated fields \(task cola reads column 3, "
                                         r"counting from 0\), got 3"):
        read_split(load_task("cola"), path)


MNLI_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                     "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]


@pytest.mark.parametrize("name, header, row, expected", [
    ("mnli", MNLI_TRAIN_HEADER, ["0", "31193", "31193n", "government", "( ( Conceptually", "( Product", "(ROOT",
                                 "(ROOT", "Conceptually cream skimming has", "Product and geography",
                                 "neutral", "neutral"],
     ("Conceptually cream skimming has", "Product and geography", 1)),
    ("mnli_mm", MNLI_DEV_HEADER, ["0", "63735", "63735n", "slate", "( ( The", "( ( Some", "(ROOT", "(ROOT",
                                  "The new rights are nice", "Everyone really likes", "neutral", "neutral",
                                  "entailment", "neutral", "neutral", "contradiction"],
     ("The new rights are nice", "Everyone really likes", 2)),
    ("qqp", ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
     ["201359", "303345", "303346", "Why are African-Americans so beautiful?", "Why are hispanics so beautiful?", "0"],
     ("Why are African-Americans so beautiful?", "Why are hispanics so beautiful?", 0)),
    ("qnli", ["index", "question", "sentence", "label"],
     ["0", "What came into force after the new constitution?", "As of that day, the new constitution",
      "not_entailment"], ("What came into force after the new constitution?", "As of that day, the new constitution",
                          1)),
])
def test_glue_tasks_read_the_columns_of_glues_own_files(name, header, row, expected, tmp_path):
    """The headers of GLUE's MNLI (train: 12 columns; dev: 16, sentence1 and sentence2 at 8 and 9, gold_label last),
    QQP and QNLI files: the last label column is MNLI's gold label, not an annotator's label1."""
    task = load_task(name)
    path = tmp_path / task.dev_file
    path.write_text("\t".join(header) + "\n" + "\t".join(row) + "\n")
    split = read_split(task, path)
    assert (split.texts_a[0], split.texts_b[0], split.labels[0]) == expected
    assert task.data_subdir == {"mnli": "MNLI", "mnli_mm": "MNLI", "qqp": "QQP", "qnli": "QNLI"}[name]
    assert task.metric == ("accuracy_f1" if name == "qqp" else "accuracy")
    if name.startswith("mnli"):
        assert task.dev_file == {"mnli": "dev_matched.tsv", "mnli_mm": "dev_mismatched.tsv"}[name]


REVIEWS = {"name": "reviews", "builtin": None, "format": "tsv", "train_file": "train.tsv", "dev_file": "dev.tsv",
           "text_a": "sentence", "text_b": None, "label": "label", "labels": ["negative", "positive"],
           "metric": "accuracy"}


def _task_dir(tmp_path, monkeypatch, **changes) -> None:
    """tasks/ holding only `reviews.yaml`: REVIEWS with `changes`, a key changed to ... removed."""
    from pipeline.downstream import tasks

    task = {key: value for key, value in {**REVIEWS, **changes}.items() if value is not ...}
    (tmp_path / "reviews.yaml").write_text(json.dumps(task))  # JSON is YAML
    monkeypatch.setattr(tasks, "TASK_DIR", tmp_path)


def test_a_task_whose_labels_repeat_a_name_is_refused(tmp_path, monkeypatch):
    """Issue 39, defect 9: duplicate label names in a task YAML were accepted."""
    from pipeline.downstream import tasks

    _task_dir(tmp_path, monkeypatch, labels=["negative", "positive", "negative"])
    with pytest.raises(ValueError, match=r"reviews.yaml: labels \['negative', 'positive', 'negative'\] name "
                                         r"\['negative'\] more than once; list each class once"):
        tasks.load_task("reviews")


@pytest.mark.parametrize("changes, message", [
    ({"labels": ...}, r"reviews\.yaml: missing key\(s\) \['labels'\]; a task states name, builtin, format, train_file, "
                      r"dev_file, labels, metric \(null where it has none: builtin without built-in data, labels for a "
                      r"regression task\), a TSV or generation task also text_a, text_b, label"),
    ({"builtin": ..., "text_b": ...}, r"reviews\.yaml: missing key\(s\) \['builtin', 'text_b'\]"),
    ({"name": "films"}, r"reviews\.yaml: name 'films' is not the file's name; set name: reviews"),
], ids=["no-labels", "no-builtin-no-text_b", "another-name"])
def test_a_task_yaml_without_a_key_or_under_another_name_is_refused_naming_the_file(changes, message, tmp_path,
                                                                                     monkeypatch):
    """Without `labels` the task failed with OmegaConf's `Missing key labels`, naming no file; under
    another name its results, and messages naming `tasks/<name>.yaml`, pointed at a file that is not there."""
    from pipeline.downstream import tasks

    _task_dir(tmp_path, monkeypatch, **changes)
    with pytest.raises(ValueError, match=message):
        tasks.load_task("reviews")


def test_a_task_yaml_that_is_a_list_is_refused_naming_the_file(tmp_path, monkeypatch):
    from pipeline.downstream import tasks

    _task_dir(tmp_path, monkeypatch)
    (tmp_path / "reviews.yaml").write_text("- name: reviews\n- format: tsv\n")
    with pytest.raises(ValueError, match=r"reviews\.yaml: a task is a mapping of keys \(see .*\), not a list"):
        tasks.load_task("reviews")


@pytest.mark.parametrize("name", ["../reviews", "sub/reviews"])
def test_a_task_name_that_is_not_a_file_of_tasks_is_unknown(name, tmp_path, monkeypatch):
    """`finetune.task=../x` read x.yaml from beside the task directory."""
    from pipeline.downstream import tasks

    task_dir = tmp_path / "tasks"
    (task_dir / "sub").mkdir(parents=True)
    _task_dir(task_dir / "sub", monkeypatch)
    _task_dir(tmp_path, monkeypatch)
    monkeypatch.setattr(tasks, "TASK_DIR", task_dir)
    with pytest.raises(ValueError, match=rf"unknown task '{re.escape(name)}'; available tasks:  \(add one"):
        tasks.load_task(name)
