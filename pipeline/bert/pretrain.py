"""The BERT pretraining stages: masked LM + next sentence prediction over an examples stage's Arrow files, in
BERT's two phases (Devlin et al. 2019, §A.2): `bert_pretrain` at length 128 from random initialisation, then, when the
run has it, `bert_pretrain_phase2` at length 512 from phase 1's final weights; or, in phase 2's place, task-adaptive
pretraining (`bert_pretrain_tapt`; Gururangan et al. 2020) on the fine-tuning task's train texts from phase 1's final
weights. One code path trains them all (`Phase`).

Both phases train on the pretraining harness (pipeline/engine/pretraining.py: checkpoints, exact resume, DDP and
DeepSpeed); `BertPretraining` is what BERT supplies to it. Each phase writes its encoder in our format (`encoder/`) and
as a HuggingFace directory with its masked-LM head and tokenizer (`hf/`): transformers' BertForMaskedLM where its BERT
computes ours, else with our modelling code beside the weights (models/hf/).
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import hydra
import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import DataLoader, Subset

from conventions.piece_vectors import pieces_with_vectors
from data_prep.corpus.tokenizer import SPECIAL_TOKENS, checkpoint_tokenizer, load_tokenizer, save_hf_tokenizer
from data_prep.examples.bert_examples import continuation_mask_from_vocab
from models import IGNORE_INDEX
from models.bert import BertConfig, load_pretrained, save_pretrained
from models.checkpoint import HF_WEIGHT_FILES, hf_weights_file
from models.hf.bert import config_from_hf, continue_from_hf, hf_incompatibility, to_hf
from pipeline.bert.data import BertPretrainingCollator, MaskedBatches, PretrainingInstances
from pipeline.bert.data_stages import examples, piece_vectors, task_examples, tokenizer
from pipeline.bert.diagnostics import plateau_message, unigram_cross_entropy
from pipeline.bert.module import BertPretrainModule
from pipeline.bert.settings import BertPretrainSettings, ExamplesConfig, Masking, TokenizerConfig
from pipeline.downstream.settings import finetune_settings
from pipeline.downstream.tasks import load_task, task_data_fingerprint, task_names
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.fingerprints import files_fingerprint
from pipeline.engine.loaders import held_out_split, seeded_train_loader
from pipeline.engine.module import OptimizerSettings
from pipeline.engine.pretraining import (
    instantiate_model,
    keep_word_embeddings,
    merged_settings,
    pretraining_stage,
    start_word_embeddings,
)
from pipeline.engine.pretraining_task import PretrainingData, TrainingRun
from pipeline.engine.settings import cache_dir_of, stages_in_run, typed_settings
from pipeline.engine.snapshots import encoder_snapshot_steps
from pipeline.piece_vectors import read_piece_vectors
from pipeline.schema import FreezeEmbeddings

# The MLM and NSP heads, beside encoder/: what a later phase needs, besides the encoder, to continue pretraining.
HEADS_FILE = "pretraining_heads.safetensors"
# The encoder with its masked-LM head and its tokenizer as transformers' Auto classes load them (models/hf/bert.py)
HF_DIR = "hf"


@dataclass(frozen=True)
class Phase:
    """One pretraining phase: the stage that trains it, the examples stage it reads, and where it starts from.

    Devlin et al. 2019, §A.2: 90 % of the steps at sequence length 128, as attention is quadratic in the length,
    then the rest at 512 "to learn the positional embeddings". Phase 2 continues phase 1's weights with a fresh
    optimizer and schedule, as NVIDIA's DeepLearningExamples BERT does."""
    stage: str
    examples: str
    length_key: str                  # the config key of its sequence length
    config_blocks: tuple[str, ...]   # its settings; a later block's keys override an earlier one's
    init_from: str | None = None     # the stage whose final weights (encoder and heads) it continues
    # what an instance holds where the phase's examples stage fixes it (TAPT: one task text), else examples.packing
    packing: str | None = None

    def settings(self, cfg: DictConfig) -> BertPretrainSettings:
        """This phase's pretraining settings: phase 2's block over `pretrain`, whose keys it leaves null."""
        return merged_settings(cfg, self.config_blocks, BertPretrainSettings)

    def max_seq_length(self, cfg: DictConfig) -> int:
        """The phase's sequence length, refused before any work if the model has no position for its end."""
        length = int(OmegaConf.select(cfg, self.length_key))
        model = cfg.model.config
        positions = int(model.get("max_position_embeddings", BertConfig.max_position_embeddings))
        if model.get("position_embedding_type", "learned") != "relative" and length > positions:
            raise ValueError(f"{self.length_key}={length} is longer than the model's position table "
                             f"(model.config.max_position_embeddings={positions}); set "
                             f"model.config.max_position_embeddings={length} for the whole run (phase 1 must "
                             f"train with the table phase 2 uses, as conf/model/bert_base.yaml does), or lower "
                             f"{self.length_key}")
        return length

    def instance_packing(self, cfg: DictConfig) -> str:
        return self.packing or str(typed_settings(cfg.examples, ExamplesConfig).packing)

    def check_objective(self, cfg: DictConfig, settings: BertPretrainSettings) -> None:
        check_objective(settings, self.config_blocks[-1], self.instance_packing(cfg),
                        None if self.packing else "examples.packing")


PHASES = (Phase("bert_pretrain", "bert_examples", "examples.max_seq_length", ("pretrain",)),
          Phase("bert_pretrain_phase2", "bert_examples_phase2", "pretrain_phase2.max_seq_length",
                ("pretrain", "pretrain_phase2"), init_from="bert_pretrain"),
          # after phase 1, in phase 2's place (a run's last phase is the encoder downstream reads: encoder_stage)
          Phase("bert_pretrain_tapt", "bert_examples_tapt", "pretrain_tapt.max_seq_length",
                ("pretrain", "pretrain_tapt"), init_from="bert_pretrain", packing="doc_sentences"))


def phase_of(stage: str) -> Phase:
    """The phase a training or examples stage belongs to."""
    return next(p for p in PHASES if stage in (p.stage, p.examples))


def check_objective(settings: BertPretrainSettings, key: str, packing: str = "sentence_pairs",
                    packing_key: str | None = "examples.packing") -> None:
    """ELECTRA, and instances without a second segment, are not asked for a next-sentence task they lack.
    `packing_key`: the setting that chose `packing`; None where the phase fixes it (TAPT's one text per instance)."""
    if settings.objective == "electra" and settings.next_sentence_prediction:
        raise ValueError(f"{key}.objective=electra has no next-sentence task (Clark et al. 2020); set "
                         f"{key}.next_sentence_prediction=false")
    pairs = f"{packing_key}=sentence_pairs" if packing_key else None
    if settings.contrastive_weight > 0 and (settings.next_sentence_prediction or settings.objective != "mlm"
                                            or packing != "sentence_pairs"):
        raise ValueError(f"{key}.contrastive_weight > 0 encodes the two segments of a sentence pair apart, beside "
                         + (f"masked LM: set {key}.next_sentence_prediction=false, {key}.objective=mlm and {pairs}, "
                            f"or {key}.contrastive_weight=0" if pairs else
                            f"masked LM, and {key}'s instances hold one text: set {key}.contrastive_weight=0"))
    if packing == "doc_sentences" and settings.next_sentence_prediction:
        raise ValueError(f"{key}'s instances ({f'{packing_key}=doc_sentences' if pairs else 'one text each'}) have "
                         f"no second segment to predict; set {key}.next_sentence_prediction=false (RoBERTa's masked "
                         "LM alone)" + (f", or {pairs}" if pairs else ""))


def validate_pretraining(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: every phase in the run (`stages`, those needed upstream included) fits the model's
    position table, has a known objective and snapshots at steps it takes; a checkpoint to continue is one."""
    examples = typed_settings(cfg.examples, ExamplesConfig)
    if {"bert_tokenizer", PHASES[0].stage} & set(stages):
        check_init_from(PHASES[0].settings(cfg), examples.max_seq_length)
    if {PHASE_2.stage, TAPT.stage} <= set(stages):
        raise ValueError(f"{TAPT.stage} continues {TAPT.init_from}, as {PHASE_2.stage} does, and the downstream "
                         f"stages read one encoder: remove one of them from pipeline.stages")
    for phase in PHASES:
        if {phase.stage, phase.examples} & set(stages):
            phase.max_seq_length(cfg)
            settings = phase.settings(cfg)
            phase.check_objective(cfg, settings)
            encoder_snapshot_steps(cfg, settings, phase.config_blocks[-1])


def starts_from_piece_vectors(phase: Phase, settings: BertPretrainSettings) -> bool:
    """pretrain.init_embeddings=word2vec (in the phase's `settings`), in a phase that starts from scratch: phase 2
    starts from phase 1's weights, and pretrain.init_from from a checkpoint's, embeddings included."""
    return not phase.init_from and not settings.init_from and settings.init_embeddings == "word2vec"


def pretraining_starts_from_piece_vectors(cfg: DictConfig) -> bool:
    """Whether this run's BERT pretraining starts its word embeddings from the piece vectors: phase 1's settings (a
    phase 2 continues phase 1's weights)."""
    return starts_from_piece_vectors(PHASES[0], PHASES[0].settings(cfg))


def reads_piece_vectors(phase: Phase, cfg: DictConfig) -> bool:
    """Whether a phase reads the piece vectors: its word embeddings start from them (starts_from_piece_vectors), or
    it continues a run that started there and keeps the rows that have one (pretrain.freeze_embeddings=with_vector)."""
    settings = phase.settings(cfg)
    return starts_from_piece_vectors(phase, settings) or (
        settings.freeze_embeddings == FreezeEmbeddings.with_vector and pretraining_starts_from_piece_vectors(cfg))


def rows_with_vectors(ctx: StageContext, settings: BertPretrainSettings) -> np.ndarray | None:
    """Which word-embedding rows started from a piece vector, where pretrain.freeze_embeddings=with_vector asks: those
    of the piece-vector stage where this run's pretraining started from it, else none (None)."""
    if settings.freeze_embeddings != FreezeEmbeddings.with_vector or not pretraining_starts_from_piece_vectors(ctx.cfg):
        return None
    return pieces_with_vectors(read_piece_vectors(ctx.stage_dir("bert_piece_vectors")))


def pretraining_upstream(phase: Phase, cfg: DictConfig) -> tuple[str, ...]:
    """What a phase reads: the tokenizer, its examples, the phase it continues, and the piece vectors its word
    embeddings start from or whose rows it keeps (reads_piece_vectors)."""
    upstream = ["bert_tokenizer", phase.examples]
    if phase.init_from:
        upstream.append(phase.init_from)
    if reads_piece_vectors(phase, cfg):
        upstream.append("bert_piece_vectors")
    return tuple(upstream)


def padded_vocab_size(vocab_size: int) -> int:
    """The model's vocabulary for a tokenizer of `vocab_size` pieces: a multiple of 64 for matmul tiles."""
    return -(-vocab_size // 64) * 64


def scratch_encoder_config(cfg: DictConfig, vocab_size: int) -> BertConfig:
    """The architecture of the encoder that phase 1 builds from `model` (not from pretrain.init_from's checkpoint) for
    a tokenizer of `vocab_size` pieces: its encoder/ config, known without running it."""
    config = OmegaConf.to_container(cfg.model.config, resolve=True)
    return hydra.utils.instantiate({**config, "vocab_size": padded_vocab_size(vocab_size)})


def encoder_stage(cfg: DictConfig) -> str:
    """The stage whose encoder the run's downstream stages read: its last pretraining phase in pipeline.stages."""
    in_run = [p.stage for p in PHASES if p.stage in stages_in_run(cfg)]
    return in_run[-1] if in_run else PHASES[0].stage


def _build_model(cfg: DictConfig, settings: BertPretrainSettings, vocab_size: int) -> nn.Module:
    """The model config's BertForPreTraining, or for objective=electra its encoder as ELECTRA's discriminator; with
    pretrain.init_from, the checkpoint's architecture and weights."""
    if settings.objective == "electra":
        cfg = copy.deepcopy(cfg)
        with open_dict(cfg):
            cfg.model._target_ = "models.electra.ElectraForPreTraining"
            cfg.model.generator_layers = settings.electra.generator_layers
    padded = padded_vocab_size(vocab_size)
    if not settings.init_from:
        return instantiate_model(cfg, vocab_size=padded)
    start = Path(settings.init_from).expanduser()
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # the heads the checkpoint lacks: the same on every rank
    model, loaded = continue_from_hf(start, vocab_size=padded)
    print(f"pretrain: starting from {start} (its {', '.join(loaded)}; the rest freshly initialised)", flush=True)
    return model


def train_texts_fingerprint(cfg: DictConfig) -> str:
    """The files of finetune.task's tasks that task-adaptive pretraining reads, by content (and their definitions,
    less what only scores them)."""
    f = finetune_settings(cfg)
    return "".join(task_data_fingerprint(load_task(name), f.data_dir, cache_dir_of(cfg), texts_only=True,
                                         allow_outside=f.allow_files_outside_data_dir) for name in task_names(f.task))


def init_from_fingerprint(cfg: DictConfig) -> str:
    """The files of pretrain.init_from's checkpoint (weights, config, tokenizer), by content."""
    init_from = PHASES[0].settings(cfg).init_from
    if not init_from:
        return ""
    return files_fingerprint(Path(init_from).expanduser(), "*", cache_dir_of(cfg))


def check_init_from(settings: BertPretrainSettings, max_seq_length: int) -> None:
    """pretrain.init_from names a HuggingFace BERT directory this pipeline can continue at phase 1's
    `max_seq_length`."""
    if not settings.init_from:
        return
    start = Path(settings.init_from).expanduser()
    if not start.is_dir():
        raise FileNotFoundError(f"pretrain.init_from={settings.init_from} "
                                f"{'is a file' if start.exists() else 'does not exist'}; point it at a HuggingFace "
                                "BERT directory (config.json, model.safetensors, tokenizer files)")
    config = start / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"pretrain.init_from={settings.init_from} has no config.json; point it at a "
                                "HuggingFace BERT directory (config.json, model.safetensors, tokenizer files)")
    hf = json.loads(config.read_text())
    if hf.get("model_type") != "bert":
        raise ValueError(f"pretrain.init_from={settings.init_from} holds a {hf.get('model_type')!r} model; "
                         "continued pretraining starts from a BERT (model_type bert)")
    config_from_hf(hf)  # an architecture our BertModel has, or the reason it has not
    if settings.objective == "electra":
        raise ValueError("pretrain.init_from continues a masked-LM checkpoint; set pretrain.objective=mlm")
    if max_seq_length > hf["max_position_embeddings"]:
        raise ValueError(f"examples.max_seq_length={max_seq_length} is longer than the positions of "
                         f"pretrain.init_from's model ({hf['max_position_embeddings']}); lower it")
    # the weights and the tokenizer are read by the bert_tokenizer and bert_pretrain stages, after the corpus is
    # prepared: a directory without them is refused now
    if hf_weights_file(start) is None:
        raise FileNotFoundError(f"pretrain.init_from={settings.init_from} has a config.json but no weights "
                                f"({' or '.join(HF_WEIGHT_FILES)}); save the model there with save_pretrained, or "
                                "point pretrain.init_from at the directory that holds them")
    try:
        checkpoint_tokenizer(start)
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"pretrain.init_from={settings.init_from}: {err}") from None


def _continue_from(model: nn.Module, pretrain_dir: Path) -> None:
    """Load a finished phase's encoder and MLM/NSP heads into `model`, which has the same configuration."""
    model.load_encoder_and_heads(load_pretrained(pretrain_dir / "encoder"), load_file(str(pretrain_dir / HEADS_FILE)))


@dataclass
class BertData(PretrainingData):
    val_batches: list[dict]
    train_instances: int
    unigram_mlm_loss: float  # the held-out MLM loss of predicting from token frequencies alone
    phase_summary: dict
    mean_instance_length: float  # tokens of an instance, [CLS] and [SEP] included, over all of them


class BertPretraining:
    """One phase of BERT pretraining, as the harness (pipeline/engine/pretraining.py) runs it."""

    def __init__(self, phase: Phase):
        self.phase = phase

    def settings_key(self, cfg: DictConfig) -> str:
        return self.phase.config_blocks[-1]

    def settings(self, cfg: DictConfig) -> BertPretrainSettings:
        self.phase.max_seq_length(cfg)  # too long for the position table: fail now, not at the first batch
        settings = self.phase.settings(cfg)
        self.phase.check_objective(cfg, settings)
        return settings

    def build_module(self, ctx: StageContext, p: BertPretrainSettings) -> BertPretrainModule:
        vocab_size = load_tokenizer(ctx.stage_dir("bert_tokenizer")).get_vocab_size()
        model = _build_model(ctx.cfg, p, vocab_size)
        if self.phase.init_from:  # a resumed run then loads its own checkpoint over these
            _continue_from(model, ctx.stage_dir(self.phase.init_from))
        elif starts_from_piece_vectors(self.phase, p):
            start_word_embeddings(model.bert.embeddings.word_embeddings,
                                  read_piece_vectors(ctx.stage_dir("bert_piece_vectors")))
        # Kept as they start (Sentence-level transfer with frozen word2vec input layers, Kim 2014's "static" model):
        # at this compute masked LM pulls them towards what predicts a masked piece (frequency, syntax) and the
        # sentiment word2vec placed in them is lost (docs/pretraining_recipes.md); with_vector keeps those rows and
        # trains the ones skip-gram gave no vector
        keep_word_embeddings(model.bert.embeddings.word_embeddings, p.freeze_embeddings, rows_with_vectors(ctx, p))
        # plain Python values: a checkpoint's hyperparameters must load with torch.load(weights_only=True)
        return BertPretrainModule(model, OptimizerSettings.of(p, self.settings_key(ctx.cfg)),
                                  next_sentence_prediction=bool(p.next_sentence_prediction), objective=str(p.objective),
                                  discriminator_weight=float(p.electra.discriminator_weight),
                                  contrastive_weight=float(p.contrastive_weight),
                                  contrastive_temperature=float(p.contrastive_temperature))

    def data(self, ctx: StageContext, module: BertPretrainModule, p: BertPretrainSettings, rank: int,
             world_size: int) -> BertData:
        cfg, phase = ctx.cfg, self.phase
        tok = load_tokenizer(ctx.stage_dir("bert_tokenizer"))
        vocab_size = tok.get_vocab_size()
        dataset = PretrainingInstances([read_arrow(f) for f in sorted(ctx.stage_dir(phase.examples).glob("*.arrow"))])
        train_rows, held_out = held_out_split(len(dataset), p.val_fraction, p.val_max_instances, cfg.seed)
        train_set, val_set = Subset(dataset, train_rows), Subset(dataset, held_out)
        special_ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
        collator = BertPretrainingCollator(pad_id=tok.token_to_id("[PAD]"), mask_id=tok.token_to_id("[MASK]"),
                                           vocab_size=vocab_size, special_ids=special_ids,
                                           mlm_probability=p.mlm_probability,
                                           max_predictions_per_seq=p.max_predictions_per_seq,
                                           generator=torch.Generator().manual_seed(cfg.seed + 1),
                                           masking=p.masking, continuation=None if p.masking == Masking.token
                                           else continuation_mask_from_vocab(tok),
                                           split_segments=p.contrastive_weight > 0)
        train_loader = seeded_train_loader(MaskedBatches(train_set, collator), len(train_set), p.batch_size, cfg.seed,
                                           p.num_workers, rank, world_size)
        # Held-out batches are masked once, so every evaluation scores the same predictions.
        val_rows = [val_set[i] for i in range(len(val_set))]
        val_batches = [collator(val_rows[i:i + p.batch_size]) for i in range(0, len(val_rows), p.batch_size)]
        counts = dataset.token_counts(vocab_size, excluded=held_out)
        counts[special_ids] = 0  # never a masked-LM target
        targets = torch.cat([b["mlm_labels"][b["mlm_labels"] != IGNORE_INDEX] for b in val_batches]).numpy()
        # a uniform guess over the model's (padded) output vocabulary, and over NSP's two labels where trained, or
        # ELECTRA's weighted replaced/original guess for every token
        binary_weight = (p.electra.discriminator_weight if p.objective == "electra"
                         else float(p.next_sentence_prediction))
        # and the contrastive loss's uniform pick among the batch's second segments
        uniform = (np.log(module.model.config.vocab_size) + binary_weight * np.log(2)
                   + p.contrastive_weight * np.log(p.batch_size))
        phase_summary = {"max_seq_length": phase.max_seq_length(cfg),
                         "initialised_from": str(ctx.stage_dir(phase.init_from)) if phase.init_from else None}
        return BertData(train_loader, train_loader.sampler, DataLoader(val_batches, batch_size=None), p.batch_size,
                        float(uniform), val_batches, len(train_set), unigram_cross_entropy(counts, targets),
                        phase_summary, dataset.token_total() / max(len(dataset), 1))

    def write(self, ctx: StageContext, module: BertPretrainModule) -> None:
        model = module.model
        save_pretrained(model.bert, ctx.out_dir / "encoder")
        heads = model.heads_state_dict()
        save_file(heads, str(ctx.out_dir / HEADS_FILE))
        # HF's names: BertForPreTraining's heads (an ELECTRA discriminator's are not); the NSP head only if trained
        nsp = module.hparams.next_sentence_prediction
        hf_heads = {k: v for k, v in heads.items()
                    if k.startswith("cls.") and (nsp or not k.startswith("cls.seq_relationship."))}
        architecture = to_hf(model.bert, ctx.out_dir / HF_DIR, hf_heads)
        if hf_incompatibility(model.config):
            print(f"stage {ctx.name}: {HF_DIR}/ is {architecture}, our modelling code beside the weights (load it with "
                  f"trust_remote_code=True): {hf_incompatibility(model.config)}", flush=True)
        # the length trained at, not the position table's: phase 1 of bert_base never trains positions past 128
        save_hf_tokenizer(load_tokenizer(ctx.stage_dir("bert_tokenizer")), ctx.out_dir / HF_DIR,
                          lowercase=typed_settings(ctx.cfg.tokenizer, TokenizerConfig).lowercase,
                          model_max_length=self.phase.max_seq_length(ctx.cfg))

    def summary(self, module: BertPretrainModule, data: BertData, run: TrainingRun) -> dict:
        history = run.history
        nsp_acc = history.last("val/nsp_acc") if module.hparams.next_sentence_prediction else None
        return {"train_instances": data.train_instances,
                "val_instances": sum(len(b["next_sentence_label"]) for b in data.val_batches),
                "padded_tokens_per_s": round(run.batches_per_s * data.batch_size
                                             * data.phase_summary["max_seq_length"], 1),
                "tokens_seen": round(run.rows_seen(data.batch_size) * data.mean_instance_length),
                **_learning_summary(history.last("val/mlm_loss"), history.last("val/mlm_acc"), nsp_acc, data),
                "objective": module.hparams.objective, "final_val_rtd_acc": history.last("val/rtd_acc"),
                "final_val_contrastive_acc": history.last("val/contrastive_acc"),
                **data.phase_summary, "hf": f"{HF_DIR}/"}


def _learning_summary(mlm_loss: float | None, mlm_acc: float | None, nsp_acc: float | None, data: BertData) -> dict:
    """The held-out figures that say whether pretraining learned anything, next to what frequencies alone give: the
    unigram MLM loss and the NSP majority rate. A run still on the unigram plateau says so on the console too."""
    labels = torch.cat([b["next_sentence_label"] for b in data.val_batches])
    warning = plateau_message(mlm_loss, data.unigram_mlm_loss)
    if warning:
        print(f"WARNING: {warning}", flush=True)
    return {"final_val_mlm_loss": mlm_loss, "unigram_mlm_loss": round(data.unigram_mlm_loss, 4),
            "final_val_mlm_acc": mlm_acc, "final_val_nsp_acc": nsp_acc,
            "nsp_majority_rate": round(float(max(labels.float().mean(), 1 - labels.float().mean())), 4),
            "plateau_warning": warning}


PRETRAINING = {phase.stage: BertPretraining(phase) for phase in PHASES}

# BERT's stages: its data stages (pipeline/bert/data_stages.py), then pretraining in one or two phases
PHASE_1, PHASE_2, TAPT = PHASES
BERT_STAGES = (
    # with pretrain.init_from, the checkpoint's tokenizer: its files are the stage's input (and, through this stage,
    # the weights pretrain reads from the same directory)
    Stage("bert_tokenizer", tokenizer, ("prepare",), ("tokenizer", "pretrain.init_from"),
          fingerprint=init_from_fingerprint),
    Stage(PHASE_1.examples, partial(examples, length_key=PHASE_1.length_key), ("prepare", "bert_tokenizer"),
          ("examples", "seed")),
    # pretrain.init_embeddings=word2vec: skip-gram vectors of the WordPiece pieces, the word embeddings' start
    Stage("bert_piece_vectors", piece_vectors, ("prepare", "bert_tokenizer"), ("word2vec", "model", "seed")),
    # phase 2 (Devlin et al. §A.2; PHASES above): its own examples, and phase 1's weights
    Stage(PHASE_2.examples, partial(examples, length_key=PHASE_2.length_key), ("prepare", "bert_tokenizer"),
          ("examples", PHASE_2.length_key, "seed")),
    pretraining_stage(PHASE_1.stage, PRETRAINING[PHASE_1.stage], partial(pretraining_upstream, PHASE_1),
                      ("pretrain",)),
    pretraining_stage(PHASE_2.stage, PRETRAINING[PHASE_2.stage], partial(pretraining_upstream, PHASE_2),
                      ("pretrain", "pretrain_phase2")),
    # task-adaptive pretraining (Gururangan et al. 2020; PHASES above): the texts fine-tuning may train on, as
    # fine-tuning reads them (the task's files, its selection split, max_train_examples and the seed that draw them)
    Stage(TAPT.examples, partial(task_examples, length_key=TAPT.length_key), ("bert_tokenizer",),
          ("finetune.task", "finetune.data_dir", "finetune.selection_fraction", "finetune.max_train_examples",
           "finetune.allow_files_outside_data_dir", "data.nfkc", "data.chinese_variant", TAPT.length_key, "seed"),
          fingerprint=train_texts_fingerprint),
    pretraining_stage(TAPT.stage, PRETRAINING[TAPT.stage], partial(pretraining_upstream, TAPT),
                      ("pretrain", "pretrain_tapt")),
)
