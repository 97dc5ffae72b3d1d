"""What tests/run/test_hf_export.py and tests/run/test_hf_pipeline.py share: loading exported HuggingFace
directories in one fresh process that cannot import this repository (tests/hf_fresh_process.py), and comparing what it
gives with our own models: outputs within TOL in fp32, the tokenizers' ids equal to the pipeline's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf
from safetensors.torch import load_file

from data_prep.examples.skip_thought_examples import EOS_ID
from models.bert import BertForPreTraining, load_pretrained
from models.elmo import BiLanguageModel, ElmoEmbedder
from models.skip_thought import QuickThoughts, SkipThoughts
from pipeline.bert.pretrain import HEADS_FILE
from pipeline.engine.dag import run_dag
from pipeline.skip_thought.module import pad_sentences
from pipeline.stages import STAGES
from tests.helpers import TinyRun

REPO = Path(__file__).resolve().parent.parent
TOL = 1e-5
# Cased and uncased words, accents precomposed and combining, punctuation of several scripts, digits and superscripts,
# CJK, an emoji, a control character, the special tokens' spellings, and sentences of unequal length (padding)
TEXTS = ["The old man SAW «the ship» — naïve café, 3.5 km/h; don't stop!",
         "北京 🙂 e\u0301 x² \x1c <S> </S> [MASK] <pad> <unk> <eos> <|endoftext|>", "a"]
STEPS = ["pretrain.max_steps=6", "pretrain.val_every_steps=3"]
BERT_SPECIAL_TOKENS = {"bos_token": None, "eos_token": None, "unk_token": "[UNK]", "sep_token": "[SEP]",
                       "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}
MEASURED: dict[str, float] = {}  # what was compared -> the largest max abs diff seen


def with_overrides(cfg, overrides: list[str]):
    cfg = cfg.copy()
    for override in overrides:
        key, value = override.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value))
    return cfg


def pretrained(run: TinyRun, stage: str, *extra: str) -> Path:
    """`run`'s config with a few steps (and `extra`): its pretraining `stage` run, the stage's output directory."""
    run = TinyRun(with_overrides(run.cfg, [*STEPS, *extra]))
    run.run_stage(stage)
    return run.stage_dir(stage)


def write_run_directory(cfg, run_dir: Path, overrides: list[str]) -> None:
    """What `python -m pipeline` leaves in a run directory: the engine's links and pipeline.json (run_dag), and
    Hydra's .hydra/config.yaml and overrides.yaml."""
    run_dag(cfg, STAGES, run_dir)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))


def load_in_a_fresh_process(cases: list[dict], root: Path) -> dict:
    """Each case ({name, dir, auto: [Auto class names], texts or inputs (a torch.save file of model inputs)}) loaded
    by tests/hf_fresh_process.py in `python -I`, from an empty directory, offline, with a Hugging Face home of its
    own: name -> what it gave, and `_custom_code_modules`, the modules transformers built from the directories."""
    work = root / "fresh_process"
    (work / "cwd").mkdir(parents=True)
    (work / "cases.json").write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-I", str(REPO / "tests" / "hf_fresh_process.py"), str(REPO),
                           str(work / "cases.json"), str(work / "loaded.pt")], cwd=work / "cwd", env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    loaded = torch.load(work / "loaded.pt", weights_only=False)
    return {**{case["name"]: loaded[case["dir"]] for case in cases},
            "_custom_code_modules": loaded["_custom_code_modules"]}


def max_diff(name: str, ours: torch.Tensor, theirs: torch.Tensor) -> float:
    diff = (ours - theirs).abs().max().item() if ours.numel() else 0.0
    MEASURED[name] = max(MEASURED.get(name, 0.0), diff)
    assert ours.shape == theirs.shape and diff <= TOL, f"{name}: max abs diff {diff}"
    return diff


def print_measured() -> None:
    print("\nmax abs diff, HF directory loaded in a fresh process vs our model (fp32):")
    for name, diff in MEASURED.items():
        print(f"  {name}: {diff:.2e}")


def stage_bert(out_dir: Path) -> BertForPreTraining:
    """A BERT pretraining stage's encoder and MLM/NSP heads, as the stage wrote them in our format."""
    encoder = load_pretrained(out_dir / "encoder")
    model = BertForPreTraining(encoder.config)
    model.load_encoder_and_heads(encoder, load_file(str(out_dir / HEADS_FILE)))
    return model.eval()


def assert_bert_outputs(name: str, ours: BertForPreTraining, out: dict) -> None:
    """AutoModel's token states (at real tokens) and pooled state, and AutoModelForMaskedLM's logits, against ours."""
    batch = out["batch"]
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        sequence, pooled = ours.bert(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
        logits, _ = ours(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
    model = out["AutoModel"]
    max_diff(f"{name}: AutoModel last_hidden_state", sequence[real], model["last_hidden_state"][real])
    max_diff(f"{name}: AutoModel pooler_output", pooled, model["pooler_output"])
    max_diff(f"{name}: AutoModelForMaskedLM logits", logits[real], out["AutoModelForMaskedLM"]["logits"][real])


def assert_elmo_outputs(name: str, bilm: BiLanguageModel, vocab: list[str] | None, out: dict) -> None:
    """The biLM's layers per word as ElmoEmbedder gives them, their equal-weight mix (the evaluate stage's ELMo) and
    its mean over the words, against AutoModel's."""
    with torch.no_grad():
        layers, mask = ElmoEmbedder(bilm.eval(), vocab).embed(TEXTS)  # (B, L + 1, W, 2P)
    model = out["AutoModel"]
    assert torch.equal(model["word_mask"], mask)
    for k, layer in enumerate(model["hidden_states"]):
        max_diff(f"{name}: AutoModel hidden_states", layers[:, k][mask], layer[mask])
    mixed = layers.mean(1)  # an untrained ScalarMix weighs the layers equally
    max_diff(f"{name}: AutoModel last_hidden_state", mixed[mask], model["last_hidden_state"][mask])
    weights = mask[..., None].float()
    max_diff(f"{name}: AutoModel pooler_output", (mixed * weights).sum(1) / weights.sum(1), model["pooler_output"])


def assert_skip_thought_outputs(name: str, model: SkipThoughts | QuickThoughts, sentences: list[list[int]],
                                out: dict) -> None:
    """AutoModel's Skip-Thought vectors, and its state at every token, against our encoder's. Ours gives vectors only;
    the state at token t is the vector of a shorter sentence: the prefix up to t (uni-skip, uni Quick-Thoughts' f and
    g, and bi-skip's forward GRU), and the suffix from t (bi-skip's backward GRU, which reads the sentence from its
    end)."""
    model.eval()
    with torch.no_grad():
        vectors = model.encode(*pad_sentences(sentences))
        ids = [sentence + [EOS_ID] for sentence in sentences]
        half = model.config.encoder_dim // 2
        states = torch.zeros_like(out["AutoModel"]["last_hidden_state"])
        for row, sentence in enumerate(ids):
            for t in range(len(sentence)):
                prefix = model.encode(torch.tensor([sentence[:t + 1]]), torch.tensor([t + 1]))[0]
                if model.config.encoder == "uni":
                    states[row, t] = prefix
                else:
                    suffix = model.encode(torch.tensor([sentence[t:]]), torch.tensor([len(sentence) - t]))[0]
                    states[row, t] = torch.cat([prefix[:half], suffix[half:]])
    max_diff(f"{name}: AutoModel pooler_output", vectors, out["AutoModel"]["pooler_output"])
    max_diff(f"{name}: AutoModel last_hidden_state", states, out["AutoModel"]["last_hidden_state"])  # 0 at padding
