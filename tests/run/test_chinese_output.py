"""Chinese out of the pipeline (issue 41, items 4-5): GPT's continuations and `python -m pipeline.generate`, the
report's CJK font or its fallback message, and BERT's tokenizer as transformers' AutoTokenizer loads it."""
import json

import numpy as np
import pytest
import torch

from data_prep.corpus.tokenizer import train_wordpiece
from data_prep.examples.gpt_blocks import TOKENIZER_FILE, train_byte_level_bpe
from models.gpt import GPTLMHeadModel, gpt_config, save_pretrained
from pipeline.engine.dag import MARKER
from pipeline.engine.generation import Request, complete_characters
from pipeline.generate import main as generate_main
from pipeline.gpt.samples import continuations
from pipeline.report import fonts
from pipeline.report.plots import plot_attention

NEWS = "中国经济今年继续保持平稳较快增长，人民生活水平不断提高。"


@pytest.fixture(scope="module")
def chinese_gpt(tmp_path_factory):
    """A one-layer GPT that has learned one Chinese sentence by heart, with its byte-level BPE, as gpt_pretrain writes
    them (model/ with tokenizer.json, and the stage's completion marker)."""
    stage = tmp_path_factory.mktemp("run") / "gpt_pretrain"
    tokenizer = train_byte_level_bpe([NEWS] * 50 + ["今天天气很好。"] * 20, stage / "model", vocab_size=300,
                                     min_frequency=2)
    ids = torch.tensor([tokenizer.encode(NEWS * 3).ids])
    torch.manual_seed(0)
    model = GPTLMHeadModel(gpt_config("gpt_tiny", vocab_size=tokenizer.get_vocab_size(), n_layer=1, n_embd=64,
                                      n_head=2, n_positions=ids.shape[1]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = model(ids[:, :-1], ids[:, 1:]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_pretrained(model.eval(), stage / "model")
    (stage / MARKER).write_text("{}")
    return stage


def test_gpt_continues_a_chinese_prompt_in_whole_characters(chinese_gpt):
    from data_prep.examples.gpt_blocks import load_gpt_tokenizer
    from models.gpt import load_pretrained

    model, tokenizer = load_pretrained(chinese_gpt / "model").eval(), load_gpt_tokenizer(chinese_gpt / "model")
    for new_tokens in range(1, 8):  # wherever it stops, it stops between characters
        (text,) = continuations(model, tokenizer, "中国经济", Request(max_new_tokens=new_tokens))
        assert "\ufffd" not in text
    assert text and NEWS.startswith("中国经济" + text)
    assert complete_characters("好\ufffd\ufffd") == "好"


def test_generate_prints_the_chinese_continuation(chinese_gpt, capsys):
    assert generate_main([str(chinese_gpt.parent), "--prompt", "中国经济", "--max-new-tokens", "12"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("中国经济今年") and NEWS.startswith(printed)


def test_the_attention_heat_map_of_chinese_tokens_names_its_font_or_says_why_there_is_none(tmp_path, monkeypatch):
    assert fonts.font_for("the cat sat", tmp_path) == fonts.FontChoice(None, "")
    dejavu = fonts.installed_font("the cat")
    assert dejavu is not None and not fonts.has_glyphs(str(dejavu), "中文")
    monkeypatch.setattr(fonts, "installed_font", lambda text: None)

    def offline(cache_dir):
        raise RuntimeError("could not download pylopdf-fonts-zh-cn==0.1.1 from the package registry")
    monkeypatch.setattr(fonts, "cjk_font_file", offline)
    choice = fonts.font_for("中文", tmp_path)
    assert choice.path is None and "apt-get install fonts-noto-cjk" in choice.note
    assert "could not download" in choice.note
    monkeypatch.setattr(fonts, "installed_font", lambda text: dejavu)  # a stand-in installed font
    assert fonts.font_for("中文", tmp_path) == fonts.FontChoice(dejavu, f"CJK text drawn in the installed font "
                                                                      f"{dejavu.name}.")
    figure = plot_attention(np.eye(3), ["[CLS]", "中", "[SEP]"], tmp_path / "a.png", "t", font=dejavu)
    assert figure.axes[0].get_xticklabels()[1].get_fontproperties().get_file() == str(dejavu)


@pytest.mark.slow
def test_a_last_resort_font_that_maps_every_code_point_to_a_box_is_never_chosen():
    from matplotlib import font_manager

    from pipeline.report import fonts

    last_resort = [e.fname for e in font_manager.fontManager.ttflist if "LastResort" in e.fname]
    if not last_resort:
        pytest.skip("this matplotlib ships no last-resort font")
    assert not fonts.has_glyphs(last_resort[0], "中文")
    assert "LastResort" not in str(fonts.installed_font("他说：“我们明天去北京看看天安门吧。”"))


def test_the_registry_font_draws_chinese(tmp_path):
    path = fonts.cjk_font_file(tmp_path)
    assert fonts.has_glyphs(str(path), "他说：“我们明天去北京看看天安门吧。”")
    assert (path.parent / "PROVENANCE.md").is_file()


def test_autotokenizer_loads_our_tokenizer_and_tokenizes_mixed_chinese_and_english_as_ours(tmp_path):
    from transformers import AutoTokenizer

    sentences = ["我们今天去北京看了天安门。", "The Forbidden City is in Beijing.", "他说：“iPhone 15 很贵！”",
                 "混合 text 和 English words，还有数字 2024 年。"] * 20
    ours = train_wordpiece(sentences, tmp_path, vocab_size=200, min_frequency=2)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in ["北京的 Forbidden City 很大！", "他说：“iPhone 15 很贵！”我也买了。",
                 "未见过的字：龘 and unseen wordz"]:
        encoding = ours.encode(text)
        assert theirs(text)["input_ids"] == encoding.ids
        assert theirs.tokenize(text) == encoding.tokens[1:-1]  # without [CLS] and [SEP]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenize_chinese_chars"] is True
    assert (tmp_path / TOKENIZER_FILE).is_file()
