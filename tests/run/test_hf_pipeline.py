"""Issue 42 through the pipeline's stages: GPT, ELMo and Skip-Thought (uni- and bi-skip) pretrained a few steps by their
stages, a BERT with transformers' own layout (learned positions, post-LN) by its stage, and a BERT run that fine-tuned,
each exported from its run directory by `python -m pipeline.export` and loaded in ONE fresh process that cannot import
this repository (tests/hf_checks.py), compared with the stage's own model and tokenizer; the cards of a run with
fine-tuning results and of a run with two final models. Slow: ~1-2 min on 2 cores (tests/run/test_hf_export.py covers
the
conversions, BERT's stage and the export in the fast suite)."""
from __future__ import annotations

import json
import re

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from data_prep.corpus.tokenizer import load_tokenizer  # noqa: E402
from data_prep.examples.elmo_examples import read_word_vocab  # noqa: E402
from data_prep.examples.gpt_blocks import load_gpt_tokenizer  # noqa: E402
from data_prep.examples.skip_thought_examples import EOS_ID, WordVocab  # noqa: E402
from models.elmo import load_pretrained as load_bilm  # noqa: E402
from models.elmo import sentence_batch_inputs  # noqa: E402
from models.generation import greedy  # noqa: E402
from models.gpt import load_pretrained as load_gpt  # noqa: E402
from models.skip_thought import load_pretrained as load_skip_thought  # noqa: E402
from pipeline.export import main as export_main  # noqa: E402
from tests.helpers import family_config  # noqa: E402
from tests.hf_checks import (  # noqa: E402
    BERT_SPECIAL_TOKENS,
    STEPS,
    TEXTS,
    assert_bert_outputs,
    assert_elmo_outputs,
    assert_skip_thought_outputs,
    load_in_a_fresh_process,
    max_diff,
    print_measured,
    stage_bert,
    with_overrides,
    write_run_directory,
)

pytestmark = pytest.mark.slow

LEARNED_POST_LN = ["model.config.position_embedding_type=learned", "model.config.pre_layer_norm=false"]
FINETUNED = [*STEPS, *LEARNED_POST_LN, "pipeline.stages=[bert_pretrain,finetune]",
             "finetune.baselines=[majority_class]"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, family_data):
    root = tmp_path_factory.mktemp("hf_pipeline")
    runs = {  # run -> (config, the overrides its command line had)
        "gpt": (with_overrides(family_data("gpt").cfg, [*STEPS, "pipeline.until=gpt_pretrain"]),
                ["+experiment=gpt_tiny", *STEPS, "pipeline.until=gpt_pretrain"]),
        "elmo": (with_overrides(family_data("elmo").cfg, [*STEPS, "pipeline.until=elmo_pretrain"]),
                 ["+experiment=elmo_small", *STEPS, "pipeline.until=elmo_pretrain"]),
        # BERT with transformers' own layout, fine-tuned beside its random twin: the card's downstream results
        "bert": (with_overrides(family_data("bert").cfg, FINETUNED), ["+experiment=bert_tiny", *FINETUNED]),
        # Skip-Thought's two final models in one run
        "skip_thought": (family_config(root / "skip_thought", "skip_thought", [
            *STEPS, "pipeline.stages=[skip_thought_pretrain,skip_thought_bi_pretrain]"]),
            ["+experiment=skip_thought_small", *STEPS,
             "pipeline.stages=[skip_thought_pretrain,skip_thought_bi_pretrain]"]),
    }
    for name, (cfg, overrides) in runs.items():
        write_run_directory(cfg, root / name, overrides)
        assert export_main([str(root / name), "--to", str(root / "exported")]) == 0
    auto = {"gpt": ["AutoModelForCausalLM"], "bert": ["AutoModel", "AutoModelForMaskedLM"]}
    folders = sorted(p.name for p in (root / "exported").iterdir())
    cases = [{"name": name, "dir": str(root / "exported" / name), "texts": TEXTS, "auto": auto.get(name, ["AutoModel"])}
             for name in folders]
    yield {"root": root, "folders": folders, "loaded": load_in_a_fresh_process(cases, root)}
    print_measured()


def test_every_final_model_of_the_runs_is_exported_in_its_own_folder(exported):
    assert exported["folders"] == ["bert", "elmo", "gpt", "skip_thought", "skip_thought_bi"]


def test_bert_with_transformers_layout_loads_as_bert_for_masked_lm(exported, family_data):
    out, run = exported["loaded"]["bert"], exported["root"] / "bert"
    assert out["classes"] == {"AutoModel": "BertModel", "AutoModelForMaskedLM": "BertForMaskedLM"}
    tokenizer = load_tokenizer(run / "bert_tokenizer")
    assert out["tokenizer"]["ids"] == [encoding.ids for encoding in tokenizer.encode_batch(TEXTS)]
    assert out["tokenizer"]["special"] == BERT_SPECIAL_TOKENS
    assert out["tokenizer"]["model_max_length"] == family_data("bert").cfg.examples.max_seq_length
    assert_bert_outputs("bert (learned positions, post-LN; bert_pretrain stage, exported)",
                        stage_bert(run / "bert_pretrain"), out)


def test_gpt_from_its_stage_loads_with_its_tokenizer_logits_and_generation(exported, family_data):
    out, stage_dir = exported["loaded"]["gpt"], exported["root"] / "gpt" / "gpt_pretrain"
    assert out["classes"] == {"AutoModelForCausalLM": "GPT2LMHeadModel"}
    tokenizer, ours = load_gpt_tokenizer(stage_dir / "model"), load_gpt(stage_dir / "model").eval()
    assert out["tokenizer"]["ids"] == [tokenizer.encode(text).ids for text in TEXTS]
    assert out["tokenizer"]["model_max_length"] == family_data("gpt").cfg.gpt.block_size
    for i, ids in enumerate(out["tokenizer"]["ids"]):
        with torch.no_grad():
            logits = ours(torch.tensor([ids[:ours.config.n_positions]])).logits[0]
        max_diff("gpt (gpt_pretrain stage, exported): AutoModelForCausalLM logits", logits,
                 out["AutoModelForCausalLM"][i])
    prompt = out["tokenizer"]["ids"][0][:4]
    assert out["generated"] == prompt + greedy(ours, [prompt], 8)[0]


def test_elmo_from_its_stage_loads_with_its_words_and_representations(exported):
    out, run = exported["loaded"]["elmo"], exported["root"] / "elmo"
    bilm = load_bilm(run / "elmo_pretrain" / "bilm")
    inputs, mask = sentence_batch_inputs(TEXTS, None, bilm.config.max_characters_per_token)
    chars, word_mask = out["words"]
    assert torch.equal(chars, torch.from_numpy(inputs)) and torch.equal(word_mask, torch.from_numpy(mask))
    assert_elmo_outputs("elmo (elmo_pretrain stage, exported)", bilm,
                        read_word_vocab(run / "elmo_vocab" / "vocab.txt"), out)


@pytest.mark.parametrize("name, stage", [("skip_thought", "skip_thought_pretrain"),
                                         ("skip_thought_bi", "skip_thought_bi_pretrain")])
def test_skip_thought_from_its_stages_loads_with_its_tokenizer_and_vectors(exported, name, stage):
    out, stage_dir = exported["loaded"][name], exported["root"] / "skip_thought" / stage
    vocab = WordVocab.load(stage_dir / "model" / "vocab.txt")
    assert out["tokenizer"]["ids"] == [vocab.encode(text) + [EOS_ID] for text in TEXTS]
    assert out["tokenizer"]["model_max_length"] == 31  # skip_thought.max_words, and <eos>
    model = load_skip_thought(stage_dir / "model").eval()
    assert_skip_thought_outputs(f"{name} ({stage} stage, exported)", model, [vocab.encode(text) for text in TEXTS], out)


def card(path) -> tuple[dict, str]:
    _, metadata, body = path.read_text().split("---\n", 2)
    return yaml.safe_load(metadata), body


def test_the_card_of_a_fine_tuned_run_gives_its_results_beside_the_random_twin(exported):
    run = exported["root"] / "bert"
    metadata, body = card(exported["root"] / "exported" / "bert" / "README.md")
    assert metadata["pipeline_tag"] == "fill-mask" and "custom_code" not in metadata["tags"]
    assert 'AutoModelForMaskedLM.from_pretrained("' in body and "trust_remote_code" not in body
    rows = {(r["model"], r["train_examples"]): r for r in json.loads((run / "finetune" / "results.json").read_text())}
    mine, twin = rows["bert", 160], rows["bert_random", 160]
    ahead = sum(a > b for a, b in zip(mine["per_seed"], twin["per_seed"]))
    assert (f"| sst2 | accuracy | 160 | bert {mine['score']:.4f} | {twin['score']:.4f} | "
            f"{mine['score'] - twin['score']:+.4f} | {ahead} of 1 | majority_class "
            f"{rows['majority_class', 160]['score']:.4f} |") in body
    assert re.search(r"python -m pipeline \+experiment=bert_tiny .*'pipeline.stages=\[bert_pretrain,finetune\]'", body)


def test_the_cards_of_two_final_models_of_one_family_say_which_each_is(exported):
    for name, encoder in (("skip_thought", "(uni-skip)"), ("skip_thought_bi", "(bi-skip)")):
        metadata, body = card(exported["root"] / "exported" / name / "README.md")
        assert metadata["pipeline_tag"] == "feature-extraction" and encoder in body
        assert "The run fine-tuned and probed nothing with this model." in body
    _, gpt = card(exported["root"] / "exported" / "gpt" / "README.md")
    assert "AutoModelForCausalLM" in gpt and "held-out perplexity" in gpt and "for a uniform guess" in gpt
