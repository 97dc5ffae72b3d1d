"""The report stage's files, figures and W&B logging, from stage outputs the tests write themselves."""
from __future__ import annotations

import csv
import json
from functools import partial
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from matplotlib.container import BarContainer
from omegaconf import OmegaConf

from data_prep.corpus.tokenizer import train_wordpiece
from models.bert import BertModel, bert_config, save_pretrained
from pipeline import CONF_DIR
from pipeline.bert.attention import AttentionRequest, attention_matrix
from pipeline.bert.attention import report_section as attention_section
from pipeline.report.plots import plot_attention, plot_pretraining, plot_task_scores
from pipeline.report.report import write_report as write_report_sections
from pipeline.report.stage import pretraining_stages
from tests.helpers import OBJECTS, SUBJECTS, VERBS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SENTENCE = "The captain saw the ship"

FINETUNE_ROWS = [
    {"model": "bert", "task": "cola", "metric": "matthews_corrcoef", "score": 0.12, "std": 0.03, "seeds": 3},
    {"model": "bert_random", "task": "cola", "metric": "matthews_corrcoef", "score": -0.02, "std": 0.01, "seeds": 3},
    {"model": "majority_class", "task": "cola", "metric": "matthews_corrcoef", "score": 0.0, "std": 0.0, "seeds": 1},
    {"model": "bert", "task": "mrpc", "metric": "accuracy", "score": 0.70, "std": 0.02, "seeds": 3},
    {"model": "bert", "task": "mrpc", "metric": "f1", "score": 0.81, "std": 0.01, "seeds": 3},
    {"model": "bert_random", "task": "mrpc", "metric": "accuracy", "score": 0.66, "std": 0.04, "seeds": 3},
    {"model": "bert_random", "task": "mrpc", "metric": "f1", "score": 0.79, "std": 0.02, "seeds": 3},
    {"model": "majority_class", "task": "mrpc", "metric": "accuracy", "score": 0.68, "std": 0.0, "seeds": 1},
    {"model": "majority_class", "task": "mrpc", "metric": "f1", "score": 0.81, "std": 0.0, "seeds": 1},
    # regression: no majority-class row
    {"model": "bert", "task": "stsb", "metric": "pearson", "score": 0.30, "std": 0.05, "seeds": 3},
    {"model": "bert_random", "task": "stsb", "metric": "pearson", "score": 0.10, "std": 0.02, "seeds": 3},
]
EVALUATE_ROWS = [
    {"model": "bert_cls", "task": "MR", "metric": "accuracy", "score": 0.61, "std": 0.0, "seeds": 1},
    {"model": "glove_bow", "task": "MR", "metric": "accuracy", "score": 0.74, "std": 0.0, "seeds": 1},
    {"model": "glove_bow", "task": "SICKEntailment", "metric": "accuracy", "score": 0.70, "std": 0.0, "seeds": 1,
     "pair_features": ["abs_diff", "product"]},
    {"model": "glove_bow", "task": "MRPC", "metric": "f1", "score": 0.80, "std": 0.0, "seeds": 1,
     "pair_features": ["abs_diff", "product"]},
]


def _write_loss_curve(stage_dir: Path, perplexity_name: str | None) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "split": "train", "name": "train/loss", "value": 8.0 - s / 20} for s in range(1, 101)]
    for step in (50, 100):
        rows.append({"step": step, "split": "val", "name": "val/loss", "value": 8.0 - step / 25})
        if perplexity_name:
            rows.append({"step": step, "split": "val", "name": perplexity_name, "value": 3000.0 / step})
    with open(stage_dir / "loss_curve.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "split", "name", "value"])
        writer.writeheader()
        writer.writerows(rows)
    (stage_dir / "stage.json").write_text(json.dumps({"steps": 100, "seconds": 12.0, "duration_s": 12.5,
                                                      "precision": "32-true", "num_parameters": 1234}))


@pytest.fixture(scope="module")
def bert_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A pretrain stage's outputs (a randomly initialised 2-layer, 2-head encoder, a loss curve with masked-LM
    perplexity) and a tiny WordPiece tokenizer stage."""
    root = tmp_path_factory.mktemp("bert")
    sentences = [f"{s} {v} {o}" for s in SUBJECTS for v in VERBS for o in OBJECTS]
    tok = train_wordpiece(sentences, root / "bert_tokenizer", vocab_size=200, min_frequency=1)
    torch.manual_seed(0)
    config = bert_config("bert_tiny", vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                         max_position_embeddings=32)
    save_pretrained(BertModel(config), root / "bert_pretrain" / "encoder")
    _write_loss_curve(root / "bert_pretrain", "val/mlm_perplexity")
    return root / "bert_pretrain", root / "bert_tokenizer"


@pytest.fixture
def stage_dirs(tmp_path, bert_dirs) -> dict[str, Path]:
    dirs = {"finetune": tmp_path / "finetune", "evaluate": tmp_path / "evaluate", "bert_pretrain": bert_dirs[0],
            "bert_tokenizer": bert_dirs[1], "elmo_pretrain": tmp_path / "elmo_pretrain",
            "skip_thought_pretrain": tmp_path / "skip_thought_pretrain"}
    for stage, rows in (("finetune", FINETUNE_ROWS), ("evaluate", EVALUATE_ROWS)):
        dirs[stage].mkdir()
        (dirs[stage] / "results.json").write_text(json.dumps(rows))
    (dirs["evaluate"] / "stage.json").write_text(json.dumps({"tasks_without_data": {}}))
    _write_loss_curve(dirs["elmo_pretrain"], "val/perplexity")
    _write_loss_curve(dirs["skip_thought_pretrain"], None)
    return dirs


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, _ = matplotlib.image.imread(path).shape
    assert height > 200 and width > 200


def write_report(stage_dirs: dict, out: Path, title: str, attention: AttentionRequest | None = None, **kwargs):
    """The report stage's write_report: every family's pretraining stages, BERT's attention section on request."""
    sections = ()
    if attention is not None:
        cfg = OmegaConf.create({"pipeline": {"stages": ["bert_pretrain"]}, "paths": {"cache_dir": str(out / "cache")},
                                "report": {"attention_sentence": attention.sentence,
                                           "attention_layer": attention.layer, "attention_head": attention.head},
                                # the run's trainer block: trainer.fast_kernels
                                "trainer": OmegaConf.load(CONF_DIR / "trainer" / "cpu.yaml").trainer})
        sections = (partial(attention_section, cfg),)
    return write_report_sections(stage_dirs, out, title, pretraining_stages(), sections, **kwargs)


class RecordingRun:
    """Stands in for a W&B run: keeps what was logged."""

    def __init__(self):
        self.logged: dict = {}

    def log(self, data: dict) -> None:
        self.logged.update(data)


def test_report_writes_tables_json_and_readable_plots(stage_dirs, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    paths = write_report(stage_dirs, out, "unit", attention=AttentionRequest(SENTENCE, layer=-1, head=1))
    assert set(paths) == {"results_md", "results_csv", "results_json", "task_scores_plot", "attention_plot",
                          "bert_pretrain_loss_plot", "elmo_pretrain_loss_plot", "skip_thought_pretrain_loss_plot"}
    for name, path in paths.items():
        if name.endswith("_plot"):
            _assert_png(path)
    expected = [{"stage": "finetune", **r} for r in FINETUNE_ROWS] + [{"stage": "evaluate", **r} for r in EVALUATE_ROWS]
    assert json.loads(paths["results_json"].read_text()) == expected
    with open(paths["results_csv"]) as f:
        assert [(r["stage"], r["model"], r["task"], r["metric"]) for r in csv.DictReader(f)] == \
            [(r["stage"], r["model"], r["task"], r["metric"]) for r in expected]
    md = paths["results_md"].read_text()
    assert "| bert | cola | matthews_corrcoef | 0.1200 ± 0.0300 | 3 |" in md
    assert "| encoder | MR accuracy |" in md
    assert "- pair features of SICKEntailment, MRPC: [abs_diff, product] (senteval.pair_features)" in md
    assert "- held-out perplexity: 60.0 @ 50, 30.0 @ 100" in md  # BERT's val/mlm_perplexity and ELMo's val/perplexity
    assert md.count("held-out perplexity") == 2  # Skip-Thought logs none
    for name in ("task_scores.png", "attention.png", "bert_pretrain_loss.png"):
        assert f"]({name})" in md


def test_report_logs_the_table_and_every_plot_to_the_wandb_run(stage_dirs, tmp_path):
    import wandb

    out = tmp_path / "report"
    out.mkdir()
    run = RecordingRun()
    paths = write_report({k: stage_dirs[k] for k in ("finetune", "bert_pretrain")}, out, "unit", wandb_run=run)
    assert set(run.logged) == {"report/results", "report/task_scores_plot", "report/bert_pretrain_loss_plot"}
    table = run.logged["report/results"]
    assert isinstance(table, wandb.Table)
    assert table.columns == ["stage", "model", "task", "metric", "score", "std", "seeds", "train_size",
                             "train_examples"]
    assert table.data[0] == ["finetune", "bert", "cola", "matthews_corrcoef", 0.12, 0.03, 3, None, None]
    assert len(table.data) == len(FINETUNE_ROWS)
    assert all(isinstance(run.logged[f"report/{n}"], wandb.Image) for n in paths if n.endswith("_plot"))


def test_bar_chart_has_one_group_per_task_and_one_bar_per_model(tmp_path):
    fig = plot_task_scores({"Fine-tuning": FINETUNE_ROWS}, tmp_path / "scores.png", "unit")
    _assert_png(tmp_path / "scores.png")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cola\nmatthews_corrcoef", "mrpc\naccuracy",
                                                            "stsb\npearson"]
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, BarContainer)}
    assert list(bars) == ["bert", "bert_random", "majority_class"]
    heights = {model: [bar.get_height() for bar in container] for model, container in bars.items()}
    assert heights["bert"] == pytest.approx([0.12, 0.70, 0.30])
    assert heights["majority_class"][:2] == pytest.approx([0.0, 0.68]) and np.isnan(heights["majority_class"][2])
    # error bars: std over seeds, drawn from score - std to score + std; none for the single-seed majority class
    (error_lines,) = bars["bert_random"].errorbar.lines[2]
    spans = [segment[1, 1] - segment[0, 1] for segment in error_lines.get_segments()]
    assert spans == pytest.approx([0.02, 0.08, 0.04])
    (majority_lines,) = bars["majority_class"].errorbar.lines[2]
    assert all(segment.size == 0 for segment in majority_lines.get_segments())


def test_pretraining_plot_draws_the_unigram_baseline_and_the_held_out_accuracies(tmp_path):
    curve = [(s, 7.0 - s / 100) for s in range(1, 50)]
    fig = plot_pretraining(curve, curve[::10], [(10, 300.0)], tmp_path / "a.png", "diagnostics",
                           val_mlm_loss=[(10, 6.5), (40, 5.9)], unigram_loss=6.81,
                           accuracies={"masked LM": [(10, 0.1), (40, 0.2)], "next sentence": [(10, 0.5)]},
                           majority_rate=0.56)
    loss_ax, _, accuracy_ax = fig.axes
    baseline = [line for line in loss_ax.get_lines() if line.get_label().startswith("unigram baseline")]
    assert len(baseline) == 1 and baseline[0].get_ydata()[0] == pytest.approx(6.81)
    assert {line.get_label() for line in accuracy_ax.get_lines()} >= {"masked LM", "next sentence"}
    _assert_png(tmp_path / "a.png")


def test_report_states_the_plateau_in_plain_words(stage_dirs, tmp_path):
    from pipeline.bert.diagnostics import plateau_message

    info = json.loads((stage_dirs["bert_pretrain"] / "stage.json").read_text())
    for name, mlm_loss in (("stuck", 6.70), ("learned", 5.20)):
        stage = tmp_path / name
        stage.mkdir()
        (stage / "loss_curve.csv").write_text((stage_dirs["bert_pretrain"] / "loss_curve.csv").read_text())
        (stage / "stage.json").write_text(json.dumps({
            **info, "final_val_mlm_loss": mlm_loss, "unigram_mlm_loss": 6.81, "final_val_mlm_acc": 0.2,
            "final_val_nsp_acc": 0.6, "nsp_majority_rate": 0.55, "plateau_warning": plateau_message(mlm_loss, 6.81)}))
        out = tmp_path / f"report_{name}"
        out.mkdir()
        md = write_report({"bert_pretrain": stage}, out, "unit")["results_md"].read_text()
        assert f"held-out masked-LM loss {mlm_loss:.3f} against the unigram baseline 6.810" in md
        assert ("has not left the unigram plateau" in md) == (name == "stuck")


def test_pretraining_plot_adds_a_log_perplexity_panel_only_when_logged(tmp_path):
    curve = [(s, 5.0 - s / 100) for s in range(1, 50)]
    assert len(plot_pretraining(curve, curve[::10], [], tmp_path / "a.png", "no perplexity").axes) == 1
    fig = plot_pretraining(curve, curve[::10], [(10, 300.0), (40, 90.0)], tmp_path / "b.png", "perplexity")
    assert len(fig.axes) == 2 and fig.axes[1].get_yscale() == "log"
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()  # perplexity read against the whole run's steps
    _assert_png(tmp_path / "b.png")


def _attention_by_hand(encoder_dir: Path, input_ids: torch.Tensor, layer: int, head: int) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) of one head, from the layer's own query/key weights applied to its input hidden
    states, the latter computed layer by layer (post-LN BERT: a layer's attention reads its input unnormalised)."""
    from models.bert import load_pretrained

    model = load_pretrained(encoder_dir).eval()
    with torch.no_grad():
        hidden = model.embeddings(input_ids, torch.zeros_like(input_ids))
        for block in model.encoder.layer[:layer]:
            hidden, _ = block(hidden)
        attention = model.encoder.layer[layer].attention.self
        size = attention.attention_head_size
        columns = slice(head * size, (head + 1) * size)
        q, k = attention.query(hidden)[0, :, columns], attention.key(hidden)[0, :, columns]
        return torch.softmax(q @ k.T / size ** 0.5, dim=-1).numpy()


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 1), (-1, 0)])
def test_attention_matrix_is_the_models_attention_for_that_layer_and_head(bert_dirs, layer, head):
    from data_prep.corpus.tokenizer import load_tokenizer

    pretrain_dir, tokenizer_dir = bert_dirs
    heat = attention_matrix(pretrain_dir / "encoder", tokenizer_dir, AttentionRequest(SENTENCE, layer, head))
    assert heat.tokens == ["[CLS]", "the", "captain", "saw", "the", "ship", "[SEP]"]
    assert (heat.layer, heat.num_layers, heat.head) == (layer % 2, 2, head)
    ids = torch.tensor([load_tokenizer(tokenizer_dir).encode(SENTENCE).ids])
    expected = _attention_by_hand(pretrain_dir / "encoder", ids, layer % 2, head)
    np.testing.assert_allclose(heat.matrix, expected, atol=1e-5)
    # distinct heads and layers really differ, so indexing mistakes cannot pass unnoticed
    other = _attention_by_hand(pretrain_dir / "encoder", ids, (layer + 1) % 2, 1 - head)
    assert not np.allclose(heat.matrix, other, atol=1e-3)


@pytest.mark.parametrize("layer,head,message", [(2, 0, r"attention_layer=2, but the encoder has 2 layers"),
                                                (0, 2, r"attention_head=2, but the encoder has 2 heads")])
def test_attention_request_outside_the_model_says_what_exists(bert_dirs, layer, head, message):
    with pytest.raises(ValueError, match=message):
        attention_matrix(bert_dirs[0] / "encoder", bert_dirs[1], AttentionRequest(SENTENCE, layer, head))


def test_attention_sentence_longer_than_the_encoder_is_cut_to_its_positions(bert_dirs):
    heat = attention_matrix(bert_dirs[0] / "encoder", bert_dirs[1], AttentionRequest(" ".join([SENTENCE] * 8), 0, 0))
    assert heat.truncated and heat.matrix.shape == (32, 32) and heat.tokens[0] == "[CLS]" and heat.tokens[-1] == "[SEP]"
    short = attention_matrix(bert_dirs[0] / "encoder", bert_dirs[1], AttentionRequest(SENTENCE, 0, 0))
    assert not short.truncated


def test_attention_heat_map_draws_the_matrix_with_token_labels(tmp_path):
    tokens = ["[CLS]", "it", "was", "tired", "[SEP]"]
    matrix = np.random.default_rng(0).dirichlet(np.ones(5), size=5)
    fig = plot_attention(matrix, tokens, tmp_path / "attention.png", "layer 1, head 0")
    _assert_png(tmp_path / "attention.png")
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.images[0].get_array(), matrix)
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens == [t.get_text() for t in ax.get_yticklabels()]


def test_finetune_table_shows_every_seed_and_how_often_pretraining_was_ahead(tmp_path):
    rows = [{"model": "bert", "task": "rt", "metric": "accuracy", "score": 0.75, "std": 0.01, "seeds": 3,
             "per_seed": [0.75, 0.76, 0.74], "train_size": None, "train_examples": 100},
            {"model": "bert_random", "task": "rt", "metric": "accuracy", "score": 0.72, "std": 0.07, "seeds": 3,
             "per_seed": [0.64, 0.75, 0.77], "train_size": None, "train_examples": 100}]
    md = _finetune_report(tmp_path, rows)
    assert "| 0.6400 / 0.7500 / 0.7700 |" in md
    assert "bert - bert_random = +0.0300 (mean over seeds); bert ahead on 2 of 3 seeds" in md


def _finetune_report(tmp_path: Path, rows: list[dict]) -> str:
    """results.md of a run whose finetune stage wrote `rows`."""
    (tmp_path / "finetune").mkdir()
    (tmp_path / "finetune" / "results.json").write_text(json.dumps(rows))
    (tmp_path / "report").mkdir()
    return write_report({"finetune": tmp_path / "finetune"}, tmp_path / "report", "unit")["results_md"].read_text()


def _row(model: str, per_seed: list[float]) -> dict:
    return {"model": model, "task": "rt", "metric": "accuracy", "score": round(sum(per_seed) / len(per_seed), 4),
            "std": 0.0, "seeds": len(per_seed), "per_seed": per_seed, "train_size": None, "train_examples": 100}


def _pretraining_stage(path, steps: int, seconds: float, resumed_from_step: int | None = None):
    path.mkdir()
    (path / "loss_curve.csv").write_text("step,split,name,value\n")
    (path / "stage.json").write_text(json.dumps({"steps": steps, "seconds": seconds, "num_parameters": 1000,
                                                 "resumed_from_step": resumed_from_step}))
    return path


def test_a_run_of_two_families_reports_both_beside_their_twins_and_their_pretraining_budget(tmp_path):
    """experiment=bert_vs_gpt: one fine-tuning table, what each family's pretraining gained over its random twin,
    and the training time of each family's pretraining side by side."""
    rows = [_row("bert", [0.70, 0.72]), _row("bert_random", [0.66, 0.73]), _row("gpt", [0.68, 0.69]),
            _row("gpt_random", [0.65, 0.66])]
    (tmp_path / "finetune").mkdir()
    (tmp_path / "finetune" / "results.json").write_text(json.dumps(rows))
    dirs = {"finetune": tmp_path / "finetune",
            "bert_pretrain": _pretraining_stage(tmp_path / "bert_pretrain", 1000, 160.0),
            "gpt_pretrain": _pretraining_stage(tmp_path / "gpt_pretrain", 320, 170.0)}
    (tmp_path / "report").mkdir()
    md = write_report(dirs, tmp_path / "report", "unit")
    lines = md["results_md"].read_text().splitlines()
    table = [line for line in lines if line.startswith("| ") and "| rt | accuracy |" in line]
    assert [line.split(" | ")[0] for line in table] == ["| bert", "| bert_random", "| gpt", "| gpt_random"]
    assert "- rt accuracy: bert - bert_random = +0.0150 (mean over seeds); bert ahead on 1 of 2 seeds" \
        in lines
    assert "- rt accuracy: gpt - gpt_random = +0.0300 (mean over seeds); gpt ahead on 2 of 2 seeds" in lines
    assert "| bert | bert_pretrain | 1000 | 160 | 0.160 | 1,000 |" in lines
    assert "| gpt | gpt_pretrain | 320 | 170 | 0.531 | 1,000 |" in lines
    assert "- gpt's pretraining took 1.06x the time of bert's (bert 160 s, gpt 170 s)" in lines


def test_the_budget_sums_a_familys_phases_and_estimates_a_resumed_stage_at_its_seconds_per_step(tmp_path):
    dirs = {"bert_pretrain": _pretraining_stage(tmp_path / "bert_pretrain", 100, 20.0),
            "bert_pretrain_phase2": _pretraining_stage(tmp_path / "bert_pretrain_phase2", 50, 30.0),
            "gpt_pretrain": _pretraining_stage(tmp_path / "gpt_pretrain", 200, 30.0, resumed_from_step=100)}
    (tmp_path / "report").mkdir()
    lines = write_report(dirs, tmp_path / "report", "unit")["results_md"].read_text().splitlines()
    assert "| gpt | gpt_pretrain | 200 | 30 (since the resume at step 100) | 0.300 | 1,000 |" in lines
    assert "- gpt's pretraining took 1.20x the time of bert's (bert 50 s, gpt 60 s)" in lines


def test_the_phases_of_one_family_get_no_budget_table(tmp_path):
    """BERT's phase 1 and 2 (experiment=bert_base) are one pretraining, not two budgets to hold equal."""
    dirs = {"bert_pretrain": _pretraining_stage(tmp_path / "bert_pretrain", 100, 20.0),
            "bert_pretrain_phase2": _pretraining_stage(tmp_path / "bert_pretrain_phase2", 50, 30.0)}
    (tmp_path / "report").mkdir()
    md = write_report(dirs, tmp_path / "report", "unit")["results_md"].read_text()
    assert "## Pretraining budget" not in md
    assert "## Pretraining (bert_pretrain)" in md and "## Pretraining (bert_pretrain_phase2)" in md


def test_probe_table_says_where_a_pretrained_encoder_is_not_ahead_of_its_random_twin():
    from pipeline.evaluation.stage import ENCODERS
    from pipeline.report.report import frozen_vs_random

    assert ENCODERS["bert_mean"].random_twin == "bert_mean_random" and ENCODERS["elmo"].random_twin == "elmo_random"
    assert ENCODERS["skip_thought_combine"].random_twin == "skip_thought_combine_random"
    assert ENCODERS["skip_thought_expanded"].random_twin is None and ENCODERS["glove_bow"].random_twin is None
    row = lambda model, task, metric, score: {"model": model, "task": task, "metric": metric, "score": score}  # noqa: E731
    rows = [row("elmo", "MR", "accuracy", 0.70), row("elmo_random", "MR", "accuracy", 0.65),
            row("elmo", "SICKRelatedness", "pearson", 0.60), row("elmo_random", "SICKRelatedness", "pearson", 0.62),
            row("bert_mean", "MR", "accuracy", 0.71), row("bert_mean_random", "MR", "accuracy", 0.70),
            row("glove_bow", "MR", "accuracy", 0.69), row("bert_cls", "MR", "accuracy", 0.6)]  # no twin in the table
    lines = frozen_vs_random(rows)
    assert lines[2] == ("- elmo - elmo_random: MR accuracy +0.0500, SICKRelatedness pearson -0.0200; NOT ahead on "
                        "1 of 2 (SICKRelatedness pearson): there the pretraining gave nothing over the random "
                        "architecture")
    assert lines[3] == "- bert_mean - bert_mean_random: MR accuracy +0.0100; ahead on all 1"
    assert len(lines) == 4


def test_the_label_efficiency_section_says_what_pretraining_bought_against_the_twin_and_word2vec():
    from pipeline.report.report import pretraining_gains

    def row(model, examples, score, per_seed):
        return {"model": model, "task": "rt", "metric": "accuracy", "train_examples": examples, "score": score,
                "per_seed": per_seed}

    lines = pretraining_gains([row("bert", 300, 0.70, [0.69, 0.72, 0.69]),
                               row("bert_random", 300, 0.60, [0.62, 0.58, 0.60]),
                               row("w2v_mean", 300, 0.71, [0.71, 0.71, 0.71]),
                               row("bert", 1000, 0.74, [0.74, 0.74, 0.74])])  # no twin at 1000: no line
    assert lines[2:] == ["- rt accuracy, 300 examples: bert - bert_random = +0.1000 (ahead on 3 of 3 seeds); "
                         "bert - w2v_mean = -0.0100"]


@pytest.mark.parametrize("scored_on,split", [("dev", "dev"), ("test", "test"), ("train_holdout", "held-out train")])
def test_the_label_efficiency_heading_names_the_split_its_rows_were_scored_on(tmp_path, scored_on, split):
    from pipeline.report.report import _label_efficiency_section

    rows = [{"model": model, "task": "rt", "metric": "accuracy", "train_examples": n, "score": 0.7, "seeds": 1,
             "per_seed": [0.7], "std": 0.0, "scored_on": scored_on} for model in ("bert", "bert_random")
            for n in (300, 1000)]
    lines = _label_efficiency_section(rows, tmp_path, "unit", {})
    assert f"## Label efficiency ({split} score by labelled training examples)" in lines


def test_what_pretraining_bought_states_the_gain_over_the_twin_and_over_the_control_at_each_size():
    """A pretraining that starts from word vectors: over the random twin, what the start and the pretraining bought
    together; over the control (the same start, no pretraining steps), what pretraining itself bought, ahead or
    behind, with the seeds on which it was ahead."""
    from pipeline.report.report import pretraining_gains

    def row(model, examples, per_seed, control=None):
        return {"model": model, "task": "rt", "metric": "accuracy", "train_examples": examples,
                "score": round(sum(per_seed) / len(per_seed), 4), "per_seed": per_seed,
                **({"control": control} if control else {})}

    lines = pretraining_gains([row("bert", 300, [0.69, 0.72, 0.69], "bert_w2v"),
                               row("bert_random", 300, [0.62, 0.58, 0.60]),
                               row("bert_w2v", 300, [0.70, 0.71, 0.72]),  # ahead of bert: pretraining bought nothing
                               row("w2v_mean", 300, [0.71, 0.71, 0.71]),
                               row("bert", 1000, [0.76, 0.75, 0.77], "bert_w2v"),
                               row("bert_random", 1000, [0.70, 0.71, 0.72]),
                               row("bert_w2v", 1000, [0.74, 0.76, 0.72])])
    assert lines == [
        "", "What pretraining bought, at each number of labelled examples (mean over seeds):",
        "bert_random is the random twin: the difference is what the start and the pretraining bought together.",
        "bert_w2v is the control, the same start without what pretraining trained: the difference is what pretraining "
        "itself bought.",
        "- rt accuracy, 300 examples: bert - bert_random = +0.1000 (ahead on 3 of 3 seeds); bert - bert_w2v = "
        "-0.0100 (ahead on 1 of 3 seeds); bert - w2v_mean = -0.0100",
        "- rt accuracy, 1000 examples: bert - bert_random = +0.0500 (ahead on 3 of 3 seeds); bert - bert_w2v = "
        "+0.0200 (ahead on 2 of 3 seeds)"]


def test_where_pretraining_starts_from_random_initialisation_the_report_says_the_twin_is_the_control(tmp_path):
    rows = [{**_row("bert", [0.75, 0.76, 0.74]), "control": "bert_random"}, _row("bert_random", [0.64, 0.75, 0.77]),
            {**_row("gpt", [0.70, 0.71]), "control": None}, _row("gpt_random", [0.69, 0.72])]
    (tmp_path / "finetune").mkdir()
    (tmp_path / "finetune" / "results.json").write_text(json.dumps(rows))
    out = tmp_path / "report"
    out.mkdir()
    lines = write_report({"finetune": tmp_path / "finetune"}, out, "unit")["results_md"].read_text().splitlines()
    assert ("- rt accuracy: bert - bert_random = +0.0300 (mean over seeds); bert ahead on 2 of 3 seeds (bert_random "
            "is the control too: pretraining started from random initialisation)") in lines
    assert "- rt accuracy: gpt - gpt_random = +0.0000 (mean over seeds); gpt ahead on 1 of 2 seeds" in lines
    assert not any("bert_w2v" in line for line in lines)


def test_the_headline_sets_a_pretrained_kind_beside_its_control_ahead_or_behind(tmp_path):
    rows = [{**_row("bert", [0.75, 0.76, 0.74]), "control": "bert_w2v"}, _row("bert_random", [0.64, 0.75, 0.77]),
            _row("bert_w2v", [0.74, 0.77, 0.75])]
    (tmp_path / "finetune").mkdir()
    (tmp_path / "finetune" / "results.json").write_text(json.dumps(rows))
    out = tmp_path / "report"
    out.mkdir()
    lines = write_report({"finetune": tmp_path / "finetune"}, out, "unit")["results_md"].read_text().splitlines()
    assert "- rt accuracy: bert - bert_random = +0.0300 (mean over seeds); bert ahead on 2 of 3 seeds" in lines
    assert ("- rt accuracy: bert - bert_w2v = -0.0033 (mean over seeds); bert ahead on 1 of 3 seeds (bert_w2v is the "
            "control, the same start without what pretraining trained: the difference is what pretraining itself "
            "bought)") in lines
    assert [line.split(" | ")[0] for line in lines if "| rt | accuracy |" in line] == [
        "| bert", "| bert_random", "| bert_w2v"]


def _manifest(decontamination: dict | None) -> dict:
    totals = {"files_read": 25000, "files_kept": 24864, "files_duplicate": 98, "files_near_duplicate": 14,
              "files_rejected": 24, "sentences": 294214, "input_bytes": 33_000_000}
    return {"totals": totals, **({"decontamination": decontamination} if decontamination else {})}


@pytest.mark.parametrize("decontamination, expected", [
    ({"ngram": 13, "sources": ["rotten_tomatoes dev", "MR"], "sentences_removed": 173,
      "sentences_removed_by_source": {"rotten_tomatoes dev": 38, "MR": 135}},
     "Decontaminated against the run's evaluation text (rotten_tomatoes dev, MR): 173 sentences removed, the same "
     "sentence normalised or a shared 13-gram (rotten_tomatoes dev: 38; MR: 135)."),
    (None, "Not decontaminated (data.decontaminate=false): the evaluation text may overlap it."),
])
def test_the_report_counts_what_prepare_removed_as_overlapping_the_evaluation_text(tmp_path, decontamination,
                                                                                    expected):
    """Issue 37: the report, not only the manifest and the model card, says per source what decontamination removed,
    or that the run did not decontaminate."""
    prepare = tmp_path / "prepare"
    prepare.mkdir()
    (prepare / "manifest.json").write_text(json.dumps(_manifest(decontamination)))
    out = tmp_path / "report"
    out.mkdir()
    md = write_report({"prepare": prepare}, out, "unit")["results_md"].read_text()
    assert "## Pretraining text" in md and "24,864 of its 25,000 documents kept" in md
    assert expected in md


def test_a_run_that_pretrains_reports_the_corpus_it_read_and_one_that_does_not_leaves_it_unread(tmp_path):
    from pipeline.report.stage import report_upstream
    from tests.helpers import tiny_config

    pretraining = report_upstream(tiny_config(tmp_path))
    assert "bert_pretrain" in pretraining and pretraining.count("prepare") == 1
    # an HF checkpoint fine-tuned without a corpus: nothing of this run was pretrained, no corpus is read for the report
    finetune_only = tiny_config(tmp_path, ["pipeline.stages=[finetune,report]", "finetune.models=[bert_external]",
                                           "finetune.external_encoder=/nowhere", "finetune.baselines=[]"])
    assert "prepare" not in report_upstream(finetune_only)


@pytest.mark.parametrize("stage", ["finetune", "evaluate"])
def test_a_result_stage_that_scored_nothing_is_said_to_have_no_results(tmp_path, stage):
    """An empty results.json (evaluate.encoders=[], say): plot_task_scores divided by zero models and failed the
    report stage after the whole run."""
    (tmp_path / stage).mkdir()
    (tmp_path / stage / "results.json").write_text("[]")
    (tmp_path / stage / "stage.json").write_text(json.dumps({"tasks_without_data": {}}))
    out = tmp_path / "report"
    out.mkdir()
    paths = write_report({stage: tmp_path / stage}, out, "unit")
    assert "No results: the stage scored nothing (see " in paths["results_md"].read_text()
    assert "task_scores_plot" not in paths


def test_the_probe_tasks_skipped_for_want_of_data_are_named_above_the_probes_table(tmp_path):
    """A table of MR alone, from a run without SICK's and MRPC's data, must not pass for a complete one."""
    evaluate = tmp_path / "evaluate"
    evaluate.mkdir()
    (evaluate / "results.json").write_text(json.dumps(EVALUATE_ROWS[:2]))
    sick = "/data/senteval/SICK/SICK.txt"
    (evaluate / "stage.json").write_text(json.dumps({"tasks_without_data": {
        "SICKEntailment": sick, "SICKRelatedness": sick, "MRPC": "/data/glue/MRPC"}}))
    out = tmp_path / "report"
    out.mkdir()
    md = write_report({"evaluate": evaluate}, out, "unit")["results_md"].read_text()
    not_run = (f"**Not run**: SICKEntailment (no data at {sick}); SICKRelatedness (no data at {sick}); MRPC (no data "
               "at /data/glue/MRPC). To run them, set TEXTREP_SHARED_DATA (or senteval.data_root) to the directory "
               "holding their data (docs/usage.md).")
    assert not_run in md and md.index(not_run) < md.index("| encoder | MR accuracy |")


def test_a_model_whose_every_seed_is_undefined_reads_undefined_not_nan(tmp_path):
    """A correlation of constant predictions on every seed: the table read 'nan' and the comparison '+nan (mean over
    seeds); bert ahead on 0 of 0 seeds'."""
    rows = [{**_row("bert", [0.5, 0.5]), "score": float("nan"), "seeds": 0, "per_seed": [None, None]},
            _row("bert_random", [0.5, 0.7])]
    md = _finetune_report(tmp_path, rows)
    assert "| bert | rt | accuracy | undefined | 0 | – / – | 100 |" in md
    assert "- rt accuracy: bert - bert_random undefined: no seed of bert has a defined score" in md
    assert "nan" not in md


def test_the_report_shows_what_each_model_writes_on_a_generation_task(tmp_path):
    """A model writing one stock phrase for every article scored ROUGE above 0 while nothing in the report showed it:
    the section gives each model's distinct and empty shares and its most frequent outputs, lead_n's beside them."""
    long = "Broadband economy in a record year for the technology firms of the whole wide world today"
    summaries = {
        "seq2seq": ({"outputs": 209, "distinct": 1, "distinct_share": 0.0048, "empty": 0, "empty_share": 0.0,
                     "top": [["Blair to the UK", 209]], "seed": 1}, [0.0048, 0.0144]),
        "gpt": ({"outputs": 209, "distinct": 60, "distinct_share": 0.2871, "empty": 96, "empty_share": 0.4593,
                 "top": [["", 96], [long, 21], ["Budo | to make", 3]], "seed": 1}, [0.2871]),
        "lead_n": ({"outputs": 209, "distinct": 209, "distinct_share": 1.0, "empty": 0, "empty_share": 0.0,
                    "top": [["Ad sales boost Time Warner profit Quarterly", 1]], "seed": None}, [1.0]),
    }
    rows = [{"model": model, "task": "bbc_headlines", "metric": metric, "score": 0.1, "std": 0.0, "seeds": 1,
             "per_seed": [0.1], "train_size": None, "train_examples": 1670, "output_summary": summary,
             "distinct_share_per_seed": shares}
            for model, (summary, shares) in summaries.items() for metric in ("rougeL", "exact_match")]
    rows.append(_row("bert", [0.7]))  # a classification task's rows carry no summary: no section of theirs
    md = _finetune_report(tmp_path, rows)
    section = md[md.index("## What each model writes: bbc_headlines"):].split("\n\n## ")[0].splitlines()
    table = [line for line in section if line.startswith("| ") and not line.startswith("| model")]
    assert table == [
        "| seq2seq | 1 | 0.005 = 1 of 209 (per seed 0.005 / 0.014) | 0.000 = 0 | “Blair to the UK” ×209 |",
        "| gpt | 1 | 0.287 = 60 of 209 | 0.459 = 96 | (empty) ×96; “Broadband economy in a record year for the "
        "technology firms…” ×21; “Budo \\| to make” ×3 |",  # cut to 60 characters; the cell's bar escaped
        "| lead_n | – | 1.000 = 209 of 209 | 0.000 = 0 | “Ad sales boost Time Warner profit Quarterly” ×1 |"]
    assert "What each model writes: rt" not in md


def _generation_row(model, metric, examples, score, train_size):
    return {"model": model, "task": "bbc_headlines", "metric": metric, "score": score, "std": 0.01,
            "seeds": 1 if model == "lead_n" else 3, "train_examples": examples, "train_size": train_size}


def test_a_generation_tasks_figures_draw_rouge_l_and_lead_n_flat_beside_every_size(tmp_path):
    """ROUGE-1 is bbc_headlines' main metric (the first reported, what a sweep maximises); its figures read ROUGE-L,
    as docs/seq2seq.md does; lead-N, fitted once and training nothing, is a flat line across the sizes, not a point
    at all of the data."""
    from pipeline.report.plots import plot_label_efficiency
    from pipeline.report.report import figure_metrics

    curves = [_generation_row(model, metric, n, score + (0.05 if metric == "rougeL" else 0.0), size)
              for model, scores in (("seq2seq", (0.03, 0.05, 0.08)), ("seq2seq_random", (0.01, 0.02, 0.04)))
              for metric in ("rouge1", "rougeL") for (n, size), score in zip(((300, 300), (1000, 1000), (1670, None)),
                                                                               scores)]
    lead_n = [_generation_row("lead_n", "rouge1", 1670, 0.237, None), _generation_row("lead_n", "rougeL", 1670, 0.208,
                                                                                      None)]
    sst2 = {"model": "bert", "task": "sst2", "metric": "accuracy", "score": 0.7}
    metrics = figure_metrics([*curves, *lead_n, sst2])
    assert metrics == {"bbc_headlines": "rougeL", "sst2": "accuracy"}  # other tasks: their first metric
    ax = plot_label_efficiency(curves, tmp_path / "curve.png", "unit", flat=lead_n, metrics=metrics).axes[0]
    assert "rougeL" in ax.get_ylabel()
    drawn = {c.get_label(): (list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata())) for c in ax.containers}
    assert drawn == {"seq2seq": ([300, 1000, 1670], pytest.approx([0.08, 0.10, 0.13])),
                     "seq2seq_random": ([300, 1000, 1670], pytest.approx([0.06, 0.07, 0.09]))}
    flat = [line for line in ax.lines if line.get_label().startswith("lead_n")]
    assert [line.get_label() for line in flat] == ["lead_n (trains nothing, every size): 0.208"]
    assert list(flat[0].get_ydata()) == [0.208, 0.208] and list(flat[0].get_xdata()) == [0, 1]  # the whole axis


def test_lead_n_at_all_of_the_data_is_no_second_train_size():
    """A generation run of one smaller size (finetune.train_sizes=[300]) has no curve: lead-N's one row, at all of
    the data, is not a second size."""
    from pipeline.downstream.finetune import label_efficiency

    rows = [_generation_row("seq2seq", "rougeL", 300, 0.08, 300), _generation_row("lead_n", "rougeL", 1670, 0.2, None)]
    assert label_efficiency(rows) == []
    rows.append(_generation_row("seq2seq", "rougeL", 1670, 0.1, None))
    assert [(r["model"], r["train_size"]) for r in label_efficiency(rows)] == [
        ("seq2seq", 300), ("lead_n", None), ("seq2seq", None)]
