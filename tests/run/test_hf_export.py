"""Issue 42: every family's model as a HuggingFace directory (models/hf/, each pretraining stage's hf/) and
`python -m pipeline.export` with its model card. The fast part: BERT trained a few steps by its stage and exported
from a run directory, every BERT position scheme and norm placement, and GPT, ELMo (character and word inputs) and
Skip-Thought (uni- and bi-skip) as their stages write them, all loaded through transformers' Auto classes in ONE fresh
process that cannot import this repository, and compared with our own models (tests/hf_checks.py). The other families
through their stages, and a card with fine-tuning results: tests/run/test_hf_pipeline.py (slow)."""
from __future__ import annotations

import ast
import itertools
import json
import math
import shutil
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf

transformers = pytest.importorskip("transformers")  # test-only: loading is the user's side, never the pipeline's

from data_prep.corpus.tokenizer import load_tokenizer  # noqa: E402
from data_prep.examples.gpt_blocks import (  # noqa: E402
    end_of_text_id,
    train_byte_level_bpe,
    write_hf_tokenizer_config,
)
from data_prep.examples.skip_thought_examples import (  # noqa: E402
    _TOKEN,
    _TOKEN_FOR_TOKENIZERS,
    EOS_ID,
    WordVocab,
    build_word_vocab,
    count_words,
    save_hf_tokenizer,
)
from models.bert import BertConfig, BertForPreTraining, load_pretrained  # noqa: E402
from models.elmo import BiLanguageModel, ElmoConfig, sentence_batch_inputs  # noqa: E402
from models.generation import greedy  # noqa: E402
from models.gpt import GPTConfig, GPTLMHeadModel  # noqa: E402
from models.hf import CODE_DIR  # noqa: E402
from models.hf import bert as hf_bert  # noqa: E402
from models.hf import elmo as hf_elmo  # noqa: E402
from models.hf import skip_thought as hf_skip_thought  # noqa: E402
from models.hf.gpt import to_hf as gpt_to_hf  # noqa: E402
from models.skip_thought import QuickThoughts, SkipThoughtConfig, SkipThoughts  # noqa: E402
from pipeline.engine.arrow import read_arrow  # noqa: E402
from pipeline.engine.fingerprints import _modules_of, code_files  # noqa: E402
from pipeline.export import main as export_main  # noqa: E402
from pipeline.stages import STAGES  # noqa: E402
from tests.helpers import OBJECTS, SUBJECTS  # noqa: E402
from tests.hf_checks import (  # noqa: E402
    BERT_SPECIAL_TOKENS,
    STEPS,
    TEXTS,
    assert_bert_outputs,
    assert_elmo_outputs,
    assert_skip_thought_outputs,
    load_in_a_fresh_process,
    max_diff,
    pretrained,
    print_measured,
    stage_bert,
    with_overrides,
    write_run_directory,
)

BERT_SMALL = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=24, max_relative_position=4)
GPT_CONTEXT = 16
RUN_OVERRIDES = [*STEPS, "pipeline.until=bert_pretrain"]


def randomise_(model: torch.nn.Module) -> torch.nn.Module:
    # fresh inits leave LayerNorms the identity and biases zero: random values show a swapped or dropped tensor
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def bert_inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    attention_mask = torch.ones(3, 14, dtype=torch.long)
    attention_mask[1, 9:], attention_mask[2, 3:] = 0, 0
    return {"input_ids": torch.randint(5, BERT_SMALL["vocab_size"], (3, 14), generator=g),
            "token_type_ids": (torch.arange(14) >= 7).long().expand(3, 14).contiguous(),
            "attention_mask": attention_mask}


def corpus() -> list[str]:
    return [*TEXTS, *(f"{s} saw {o}." for s in SUBJECTS for o in OBJECTS)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, family_data):
    """name -> (the directory loaded, what it is compared with), and name -> what the fresh process gave."""
    root = tmp_path_factory.mktemp("hf_export")
    models, cases = {}, []
    # BERT pretrained a few steps by its stage (bert_tiny: relative positions, pre-LN), in a run directory, exported
    bert_out = pretrained(family_data("bert"), "bert_pretrain")
    overrides = ["+experiment=bert_tiny", *RUN_OVERRIDES]
    write_run_directory(with_overrides(family_data("bert").cfg, RUN_OVERRIDES), root / "run", overrides)
    assert export_main([str(root / "run"), "--to", str(root / "exported")]) == 0
    models["bert"] = (root / "exported" / "bert", bert_out)
    cases.append({"name": "bert", "dir": str(root / "exported" / "bert"), "texts": TEXTS,
                  "auto": ["AutoModel", "AutoModelForMaskedLM"]})
    # every BERT position scheme and norm placement
    torch.save(bert_inputs(), root / "bert_inputs.pt")
    for position, pre_ln in itertools.product(("learned", "sinusoidal", "relative"), (False, True)):
        name = f"bert_{position}_{'pre' if pre_ln else 'post'}_ln"
        torch.manual_seed(0)
        model = randomise_(BertForPreTraining(BertConfig(**BERT_SMALL, position_embedding_type=position,
                                                         pre_layer_norm=pre_ln)))
        hf_bert.to_hf(model.bert, root / name, model.heads_state_dict())
        models[name] = (root / name, model)
        cases.append({"name": name, "dir": str(root / name), "auto": ["AutoModel", "AutoModelForMaskedLM"],
                      "inputs": str(root / "bert_inputs.pt")})
    # GPT as its stage writes hf/: models.hf.gpt.to_hf, the byte-level BPE, its transformers config
    tokenizer = train_byte_level_bpe(corpus(), root / "gpt", vocab_size=300, min_frequency=1)
    torch.manual_seed(0)
    gpt = randomise_(GPTLMHeadModel(GPTConfig(vocab_size=tokenizer.get_vocab_size(), n_positions=GPT_CONTEXT,
                                              n_embd=32, n_layer=2, n_head=2, eos_token_id=end_of_text_id(tokenizer))))
    gpt_to_hf(gpt, root / "gpt")
    write_hf_tokenizer_config(root / "gpt", GPT_CONTEXT)
    models["gpt"] = (root / "gpt", (gpt, tokenizer))
    # ELMo's biLM with character and with word inputs
    words = ["<S>", "</S>", "<UNK>", "The", "old", "man", "SAW", "the", "ship", ".", "a"]
    for encoder in ("char_cnn", "word"):
        torch.manual_seed(0)
        bilm = randomise_(BiLanguageModel(ElmoConfig(vocab_size=len(words), token_encoder=encoder,
                                                     filters=[[1, 8], [2, 8], [3, 4]], num_highway_layers=1,
                                                     projection_dim=8, lstm_dim=16, softmax="full")))
        hf_elmo.to_hf(bilm, root / f"elmo_{encoder}", words)
        models[f"elmo_{encoder}"] = (root / f"elmo_{encoder}", (bilm, words))
    # Skip-Thought's uni-skip and bi-skip encoders and their vocabulary
    vocab = build_word_vocab(count_words(corpus()), 60)
    for encoder in ("uni", "bi"):
        torch.manual_seed(0)
        model = randomise_(SkipThoughts(SkipThoughtConfig(vocab_size=len(vocab), embedding_dim=8, encoder_dim=12,
                                                          decoder_dim=6, encoder=encoder)))
        hf_skip_thought.to_hf(model, root / f"skip_thought_{encoder}")
        save_hf_tokenizer(vocab, root / f"skip_thought_{encoder}", model_max_length=31)
        models[f"skip_thought_{encoder}"] = (root / f"skip_thought_{encoder}", (model, vocab))
    # Quick-Thoughts: f and g, the vector [f(s); g(s)]
    torch.manual_seed(0)
    model = randomise_(QuickThoughts(SkipThoughtConfig(vocab_size=len(vocab), embedding_dim=8, encoder_dim=12,
                                                       objective="quick_thought")))
    hf_skip_thought.to_hf(model, root / "quick_thought")
    save_hf_tokenizer(vocab, root / "quick_thought", model_max_length=31)
    models["quick_thought"] = (root / "quick_thought", (model, vocab))
    cases += [{"name": name, "dir": str(models[name][0]), "texts": TEXTS,
               "auto": ["AutoModelForCausalLM"] if name == "gpt" else ["AutoModel"]}
              for name in ("gpt", "elmo_char_cnn", "elmo_word", "skip_thought_uni", "skip_thought_bi", "quick_thought")]
    yield {"root": root, "models": models, "loaded": load_in_a_fresh_process(cases, root)}
    print_measured()


def test_bert_from_its_stage_loads_from_the_export_with_its_tokenizer_and_outputs(exported, family_data):
    directory, stage_dir = exported["models"]["bert"]
    out = exported["loaded"]["bert"]
    # bert_tiny (relative positions, pre-LN): our modelling code beside the weights
    assert out["classes"] == {"AutoModel": "TextrepBertModel", "AutoModelForMaskedLM": "TextrepBertForMaskedLM"}
    tokenizer = load_tokenizer(family_data("bert").stage_dir("bert_tokenizer"))
    assert out["tokenizer"]["ids"] == [encoding.ids for encoding in tokenizer.encode_batch(TEXTS)]
    assert out["tokenizer"]["model_max_length"] == family_data("bert").cfg.examples.max_seq_length
    assert out["tokenizer"]["special"] == BERT_SPECIAL_TOKENS
    assert_bert_outputs("bert (bert_tiny, pretrain stage, exported)", stage_bert(stage_dir), out)
    # the pipeline reads the directory back (finetune.external_encoder): the same weights, the same outputs
    batch = out["batch"]
    with torch.no_grad():
        ours = stage_bert(stage_dir).bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])[0]
        back = hf_bert.from_hf(directory).eval()(batch["input_ids"], batch["token_type_ids"],
                                                 batch["attention_mask"])[0]
    assert torch.equal(ours, back)


@pytest.mark.parametrize("position, pre_ln", list(itertools.product(("learned", "sinusoidal", "relative"),
                                                                     (False, True))))
def test_every_bert_position_scheme_and_norm_placement_loads_with_the_same_outputs(exported, position, pre_ln):
    name = f"bert_{position}_{'pre' if pre_ln else 'post'}_ln"
    out = exported["loaded"][name]
    # transformers' own BERT where it computes ours: learned positions, post-LN
    prefix = "" if position == "learned" and not pre_ln else "Textrep"
    assert out["classes"] == {"AutoModel": f"{prefix}BertModel", "AutoModelForMaskedLM": f"{prefix}BertForMaskedLM"}
    assert_bert_outputs(name, exported["models"][name][1], out)


def test_gpt_loads_as_gpt2_with_its_tokenizer_logits_and_greedy_generation(exported):
    out = exported["loaded"]["gpt"]
    gpt, tokenizer = exported["models"]["gpt"][1]
    assert out["classes"] == {"AutoModelForCausalLM": "GPT2LMHeadModel"}
    assert out["tokenizer"]["ids"] == [tokenizer.encode(text).ids for text in TEXTS]
    assert out["tokenizer"]["model_max_length"] == GPT_CONTEXT
    assert out["tokenizer"]["special"]["eos_token"] == out["tokenizer"]["special"]["bos_token"] == "<|endoftext|>"
    for i, ids in enumerate(out["tokenizer"]["ids"]):
        with torch.no_grad():
            logits = gpt(torch.tensor([ids[:GPT_CONTEXT]])).logits[0]
        max_diff("gpt: AutoModelForCausalLM logits", logits, out["AutoModelForCausalLM"][i])
    prompt = out["tokenizer"]["ids"][0][:4]
    assert out["generated"] == prompt + greedy(gpt, [prompt], 8)[0]


def test_elmo_loads_with_the_biLMs_word_representations_and_its_words(exported):
    out = exported["loaded"]["elmo_char_cnn"]
    bilm, words = exported["models"]["elmo_char_cnn"][1]
    assert out["classes"] == {"AutoModel": "TextrepElmoModel"}
    # the tokens, gathered back into words by the model, are the character ids ElmoEmbedder feeds the biLM
    inputs, mask = sentence_batch_inputs(TEXTS, None, bilm.config.max_characters_per_token)
    chars, word_mask = out["words"]
    assert torch.equal(chars, torch.from_numpy(inputs)) and torch.equal(word_mask, torch.from_numpy(mask))
    special = out["tokenizer"]["special"]
    assert (special["bos_token"], special["eos_token"], special["pad_token"]) == ("<S>", "</S>", "<pad>")
    assert out["tokenizer"]["model_max_length"] > 1e20  # LSTMs have no longest input
    # a fast tokenizer's word_ids() name the words the model returns (<S> and </S> are none)
    assert [max(w for w in ids if w is not None) + 1 for ids in out["word_ids"]] == \
        out["AutoModel"]["word_mask"].sum(1).tolist()
    assert_elmo_outputs("elmo (character CNN)", bilm, None, out)


def test_a_word_input_elmo_loads_with_its_vocabulary_as_tokenizer(exported):
    out = exported["loaded"]["elmo_word"]
    bilm, words = exported["models"]["elmo_word"][1]
    inputs, mask = sentence_batch_inputs(TEXTS, {w: i for i, w in enumerate(words)})
    assert out["tokenizer"]["ids"] == [row[m].tolist() for row, m in zip(inputs, mask)]
    assert_elmo_outputs("elmo (word inputs)", bilm, words, out)


@pytest.mark.parametrize("name", ["skip_thought_uni", "skip_thought_bi", "quick_thought"])
def test_skip_thought_loads_with_its_tokenizer_and_sentence_vectors(exported, name):
    out = exported["loaded"][name]
    model, vocab = exported["models"][name][1]
    assert out["classes"] == {"AutoModel": "TextrepSkipThoughtModel"}
    assert out["tokenizer"]["ids"] == [vocab.encode(text) + [EOS_ID] for text in TEXTS]
    assert out["tokenizer"]["model_max_length"] == 31
    special = out["tokenizer"]["special"]
    assert (special["eos_token"], special["pad_token"], special["unk_token"]) == ("<eos>", "<pad>", "<unk>")
    assert_skip_thought_outputs(name, model, [vocab.encode(text) for text in TEXTS], out)


def test_the_directories_run_without_the_repository(exported):
    """The fresh process refused every import of the project (tests/hf_fresh_process.py) and built the custom models
    from the files beside the weights, which import only torch, transformers and the standard library."""
    built = {name.rsplit(".", 1)[-1] for name in exported["loaded"]["_custom_code_modules"]}
    assert built >= {"modeling_textrep_bert", "modeling_textrep_elmo", "modeling_textrep_skip_thought"}
    for path in sorted(CODE_DIR.glob("modeling_*.py")):
        tree = ast.parse(path.read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imported - set(sys.stdlib_module_names) == {"torch", "transformers"}, (path.name, imported)


@pytest.mark.parametrize("stage, code", [
    ("bert_pretrain", "modeling_textrep_bert"), ("bert_pretrain_phase2", "modeling_textrep_bert"),
    ("elmo_pretrain", "modeling_textrep_elmo"), ("skip_thought_pretrain", "modeling_textrep_skip_thought"),
    ("skip_thought_bi_pretrain", "modeling_textrep_skip_thought"), ("seq2seq_pretrain", "modeling_textrep_seq2seq"),
    ("seq2seq_pretrain", "modeling_textrep_rnn_seq2seq")])
def test_the_modelling_code_a_stage_copies_is_part_of_its_cache_key(stage, code):
    """The file is copied, never imported by the pipeline: an edit to it must still rerun the stages that copy it."""
    files = {path for module in _modules_of(STAGES[stage].fn)
             for path in code_files(Path(sys.modules[module].__file__))}
    assert (CODE_DIR / f"{code}.py").resolve() in files


def _characters() -> list[str]:
    """Every character of Python's Unicode database (tokenizers' may know later versions' characters too)."""
    return [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]


def test_skip_thoughts_tokenizer_splits_and_lowercases_every_character_as_the_pipeline_does(tmp_path):
    """Python's regex (\\w, \\s) and lower(), and their tokenizers forms (Oniguruma's classes, Lowercase): the same
    words and lower case for every character, between letters and beside a space; one known difference, the
    word-final capital sigma."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    split = pre_tokenizers.Split(Regex(_TOKEN_FOR_TOKENIZERS), behavior="removed", invert=True)
    save_hf_tokenizer(WordVocab(("<pad>", "<unk>", "<eos>")), tmp_path, 31)
    normalizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).normalizer
    characters = _characters()
    for start in range(0, len(characters), 1 << 15):
        chunk = characters[start:start + (1 << 15)]
        text = "".join(f"a{c}b{c} x'{c} " for c in chunk)
        assert [w for w, _ in split.pre_tokenize_str(text)] == _TOKEN.findall(text)
        inside_words = "".join(f"a{c}b " for c in chunk)  # Python's lower() looks at a capital sigma's neighbours
        assert normalizer.normalize_str(inside_words) == inside_words.lower()
    assert normalizer.normalize_str("ΟΔΟΣ") == "οδοσ" and "ΟΔΟΣ".lower() == "οδος"


def card(path) -> tuple[dict, str]:
    _, metadata, body = path.read_text().split("---\n", 2)
    return yaml.safe_load(metadata), body


def test_export_copies_the_final_model_with_a_card_of_the_run(exported):
    root = exported["root"]
    run_dir, directory = root / "run", root / "exported" / "bert"
    assert sorted(p.name for p in (root / "exported").iterdir()) == ["bert"]
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [*(p.name for p in (run_dir / "bert_pretrain" / "hf").iterdir()), "README.md"])
    metadata, body = card(directory / "README.md")
    assert metadata["pipeline_tag"] == "fill-mask" and metadata["library_name"] == "transformers"
    assert "custom_code" in metadata["tags"] and metadata["license"] == "other"
    for heading in ("How to load it", "Tokenizer", "Training data", "Pretraining", "Downstream results of this run",
                    "Reproduce", "License"):
        assert f"\n## {heading}\n" in body
    assert "relative positions (Shaw et al. 2018), distances clipped at 16, pre-LayerNorm blocks" in body
    assert f'AutoModelForMaskedLM.from_pretrained("{directory}", trust_remote_code=True)' in body
    summary = json.loads((run_dir / "bert_pretrain" / "stage.json").read_text())
    assert f"- {summary['steps']} steps, {summary['tokens_seen']:,} tokens seen" in body
    assert f"{summary['final_val_mlm_loss']:.3f} against the unigram baseline {summary['unigram_mlm_loss']:.3f}" in body
    manifest = json.loads((run_dir / "prepare" / "manifest.json").read_text())
    assert (f"Decontaminated against the run's evaluation text (sst2 dev): "
            f"{manifest['decontamination']['sentences_removed']:,} sentences removed") in body
    assert f"{manifest['totals']['files_kept']:,} of its {manifest['totals']['files_read']:,} documents" in body
    assert "The run fine-tuned and probed nothing with this model." in body  # it stopped after pretrain
    assert "python -m pipeline +experiment=bert_tiny pretrain.max_steps=6 pretrain.val_every_steps=3 " \
           "pipeline.until=bert_pretrain\n" in body
    assert "does not know its license" in body  # the tests' own books


def run_with_results(root: Path, name: str, stage: str, settings: dict, rows: list[dict],
                     summary: dict | None = None) -> str:
    """A copy of the fixture's run directory whose config ran `stage` too (with `settings`) and whose `stage` wrote
    `rows` (and `summary` as its stage.json): the body of its exported card."""
    run_dir = root / name
    shutil.copytree(root / "run", run_dir, symlinks=True)
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    cfg.pipeline.stages = [*cfg.pipeline.stages, stage]
    for key, value in settings.items():
        OmegaConf.update(cfg, key, value)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    (run_dir / stage).mkdir()
    (run_dir / stage / "results.json").write_text(json.dumps(rows))
    if summary is not None:
        (run_dir / stage / "stage.json").write_text(json.dumps(summary))
    assert export_main([str(run_dir), "--to", str(root / f"exported_{name}")]) == 0
    return card(root / f"exported_{name}" / "bert" / "README.md")[1]


def test_the_card_gives_the_runs_probing_results_beside_the_random_twin(exported):
    """A run whose evaluate stage probed the model: its rows beside its random twin's, and no row of an encoder of
    another model (glove_bow) or of a twin alone."""
    rows = [{"model": model, "task": "MR", "metric": "accuracy", "score": score, "std": 0.0, "seeds": 1}
            for model, score in (("bert_cls", 0.625), ("bert_cls_random", 0.5), ("glove_bow", 0.75))]
    body = run_with_results(exported["root"], "probed", "evaluate",
                            {"evaluate.encoders": ["bert_cls", "bert_cls_random", "glove_bow"]}, rows)
    assert [line for line in body.splitlines() if line.startswith("| MR |")] == \
        ["| MR | accuracy | bert_cls 0.6250 | 0.5000 | +0.1250 |"]
    assert "The run fine-tuned and probed nothing" not in body


def test_the_card_names_the_probe_tasks_the_run_skipped_for_want_of_data(exported):
    rows = [{"model": model, "task": "MR", "metric": "accuracy", "score": score, "std": 0.0, "seeds": 1}
            for model, score in (("bert_cls", 0.625), ("bert_cls_random", 0.5))]
    body = run_with_results(exported["root"], "probed_without_mrpc", "evaluate",
                            {"evaluate.encoders": ["bert_cls", "bert_cls_random"]}, rows,
                            {"tasks_without_data": {"MRPC": "/data/glue/MRPC"}})
    assert "**Not run**: MRPC (no data at /data/glue/MRPC). To run them, set TEXTREP_SHARED_DATA" in body


def test_the_card_gives_a_baseline_fitted_on_all_labels_beside_every_size(exported):
    """majority_class is fitted once, on all the labels: it stands beside each size, saying so; a baseline fitted at
    the size is given as it is."""
    def row(model, size, examples, score, per_seed):
        return {"model": model, "task": "sst2", "metric": "accuracy", "score": score, "std": 0.01,
                "seeds": len(per_seed), "per_seed": per_seed, "train_size": size, "train_examples": examples}

    rows = [row("bert", 300, 300, 0.6, [0.61, 0.59]), row("bert_random", 300, 300, 0.55, [0.56, 0.6]),
            row("majority_class", None, 11424, 0.52, [0.52]), row("bow_logreg", 300, 300, 0.58, [0.58, 0.58])]
    body = run_with_results(exported["root"], "fine_tuned", "finetune",
                            {"finetune.models": ["bert", "bert_random"]}, rows)
    assert [line for line in body.splitlines() if line.startswith("| sst2 |")] == [
        "| sst2 | accuracy | 300 | bert 0.6000 ± 0.0100 | 0.5500 ± 0.0100 | +0.0500 | 1 of 2 | "
        "majority_class 0.5200 (on all 11,424), bow_logreg 0.5800 |"]


def test_export_refuses_to_overwrite_and_what_is_no_run(exported, tmp_path, capsys):
    root = exported["root"]
    assert export_main([str(root / "run"), "--to", str(root / "exported")]) == 2
    assert "exported/bert exists; remove it, export elsewhere, or pass --overwrite" in capsys.readouterr().err
    assert export_main([str(tmp_path), "--to", str(tmp_path / "out")]) == 2
    assert "is not a directory `python -m pipeline` ran in" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_pretraining_summary_counts_the_tokens_seen(exported, family_data):
    """What the card reports: BERT's instances seen times their mean length, [CLS] and [SEP] included."""
    summary = json.loads((exported["models"]["bert"][1] / "stage.json").read_text())
    lengths = [len(ids) for f in sorted(family_data("bert").stage_dir("bert_examples").glob("*.arrow"))
               for ids in read_arrow(f).column("input_ids").to_pylist()]
    assert summary["tokens_seen"] == round(6 * family_data("bert").cfg.pretrain.batch_size * float(np.mean(lengths)))
    # a uniform guess over the (padded) vocabulary, and over next sentence prediction's two answers where trained
    rows = load_pretrained(exported["models"]["bert"][1] / "encoder").config.vocab_size
    nsp = family_data("bert").cfg.pretrain.next_sentence_prediction
    assert math.isclose(summary["uniform_val_loss"], math.log(rows) + nsp * math.log(2), rel_tol=1e-4)
