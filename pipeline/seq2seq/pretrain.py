"""The seq2seq family's pretraining and stages: its tokenizer (GPT-2's byte-level BPE with padding, start, end, mask and
sentinel tokens), the source/target pairs of each shard (BART's noising, or T5's span corruption with
seq2seq.objective=span_corruption), with pretrain.init_embeddings=word2vec the pieces' skip-gram vectors that the
shared embeddings start from (`seq2seq_piece_vectors`, BERT's and GPT's start), then denoising pretraining of the
encoder-decoder (models/seq2seq.py's Transformer, or models/rnn_seq2seq.py's RNN with attention:
pipeline/seq2seq/architectures.py) on the shared harness. The model is written in our format (`model/`, with its
tokenizer.json), read by evaluate, fine-tuning, the report and pipeline.generate, and as a HuggingFace directory
(`hf/`, models/hf/seq2seq.py): BartForConditionalGeneration where its config is BART's (models.seq2seq.bart_config:
post-LN, learned positions, no copy attention), else our modelling code beside the weights (seed 000's pre-LN
Transformer, the RNN, either with copy attention); the stage's summary names the class in its `hf` field."""
from __future__ import annotations

import json
import math
import shutil

from omegaconf import DictConfig

from data_prep.examples.gpt_blocks import TOKENIZER_FILE
from data_prep.examples.seq2seq_examples import BOS, EOS, MASK, PAD, load_seq2seq_tokenizer, special_ids
from models.hf.seq2seq import hf_architecture, to_hf
from pipeline.engine.arrow import read_arrow
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.loaders import ArrowRows, pretraining_loaders
from pipeline.engine.module import OptimizerSettings
from pipeline.engine.pretraining import (
    instantiate_model,
    pretraining_stage,
    start_piece_embeddings,
)
from pipeline.engine.pretraining_task import PretrainingData, TrainingRun
from pipeline.engine.settings import typed_settings
from pipeline.piece_vectors import read_piece_vectors
from pipeline.schema import PretrainConfig
from pipeline.seq2seq.architectures import save_model
from pipeline.seq2seq.data_stages import seq2seq_examples, seq2seq_piece_vectors, seq2seq_tokenizer
from pipeline.seq2seq.module import SOURCE_COLUMN, TARGET_COLUMN, PairCollator, Seq2SeqPretrainModule
from pipeline.seq2seq.settings import Seq2SeqBlockConfig

HF_DIR = "hf"


class Seq2SeqPretraining:
    """Denoising pretraining as the harness (pipeline/engine/pretraining.py) runs it, on seeded resumable batches of
    source/target pairs, each rank its own, with the `pretrain` settings."""

    def settings_key(self, cfg: DictConfig) -> str:
        return "pretrain"

    def settings(self, cfg: DictConfig) -> PretrainConfig:
        return typed_settings(cfg.pretrain, PretrainConfig)

    def build_module(self, ctx: StageContext, settings: PretrainConfig) -> Seq2SeqPretrainModule:
        tok = load_seq2seq_tokenizer(ctx.stage_dir("seq2seq_tokenizer"))
        ids = special_ids(tok)
        # positions for a block and its end token; a source may run one past (data_prep/examples/seq2seq_examples.py).
        # The RNN has no positions: its max_positions is the length fine-tuning cuts to, as the Transformer's
        model = instantiate_model(ctx.cfg, vocab_size=tok.get_vocab_size(), pad_token_id=ids.pad,
                                  decoder_start_token_id=ids.bos, eos_token_id=ids.eos,
                                  max_positions=typed_settings(ctx.cfg.seq2seq, Seq2SeqBlockConfig).block_size + 1)
        # the encoder's input, the decoder's input and the output layer are this one table (tied, Press & Wolf 2017)
        start_piece_embeddings(model.shared, settings,
                               lambda: read_piece_vectors(ctx.stage_dir("seq2seq_piece_vectors")))
        return Seq2SeqPretrainModule(model, OptimizerSettings.of(settings, self.settings_key(ctx.cfg)))

    def data(self, ctx: StageContext, module: Seq2SeqPretrainModule, p: PretrainConfig, rank: int,
             world_size: int) -> PretrainingData:
        config = module.model.config
        pairs = ArrowRows([read_arrow(f) for f in sorted(ctx.stage_dir("seq2seq_examples").glob("examples-*.arrow"))],
                          [SOURCE_COLUMN, TARGET_COLUMN])
        if len(pairs) < 2:
            raise ValueError(f"only {len(pairs)} seq2seq pairs: the corpus is too small; use a larger corpus or lower "
                             "seq2seq.block_size")
        train, val = pretraining_loaders(pairs, PairCollator(config.pad_token_id, config.decoder_start_token_id),
                                         p.batch_size, p.val_fraction, p.val_max_instances, ctx.cfg.seed,
                                         p.num_workers, rank, world_size)
        return PretrainingData(train, train.sampler, val, p.batch_size, uniform_loss=math.log(config.vocab_size))

    def write(self, ctx: StageContext, module: Seq2SeqPretrainModule) -> None:
        tokenizer = ctx.stage_dir("seq2seq_tokenizer") / TOKENIZER_FILE
        save_model(module.model, ctx.out_dir / "model")
        shutil.copy(tokenizer, ctx.out_dir / "model" / TOKENIZER_FILE)
        hf = ctx.out_dir / HF_DIR
        to_hf(module.model, hf)
        shutil.copy(tokenizer, hf / TOKENIZER_FILE)
        # what lets transformers' AutoTokenizer load tokenizer.json with the model's special tokens
        (hf / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": module.model.config.max_positions,
            "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "mask_token": MASK}, indent=2) + "\n")

    def summary(self, module: Seq2SeqPretrainModule, data: PretrainingData, run: TrainingRun) -> dict:
        # `hf`: the class transformers builds from hf/; `model`: which architecture the report's seq2seq rows are
        return {"pairs_seen": run.rows_seen(data.batch_size), "hf": hf_architecture(module.model),
                "model": module.model.describe()}


def pretraining_starts_from_piece_vectors(cfg: DictConfig) -> bool:
    """pretrain.init_embeddings=word2vec, read where seq2seq_pretrain reads its settings."""
    return Seq2SeqPretraining().settings(cfg).init_embeddings == "word2vec"


def pretraining_upstream(cfg: DictConfig) -> tuple[str, ...]:
    """What seq2seq_pretrain reads: the tokenizer, the pairs, and the piece vectors its embeddings start from."""
    return ("seq2seq_tokenizer", "seq2seq_examples") + (("seq2seq_piece_vectors",)
                                                        if pretraining_starts_from_piece_vectors(cfg) else ())


SEQ2SEQ_STAGES = (
    Stage("seq2seq_tokenizer", seq2seq_tokenizer, ("prepare",),
          ("seq2seq.vocab_size", "seq2seq.min_frequency", "seq2seq.max_sentences", "seq2seq.num_sentinels")),
    Stage("seq2seq_examples", seq2seq_examples, ("prepare", "seq2seq_tokenizer"),
          ("seq2seq.block_size", "seq2seq.objective")),
    # pretrain.init_embeddings=word2vec: skip-gram vectors of the byte-level pieces, the shared embeddings' start
    Stage("seq2seq_piece_vectors", seq2seq_piece_vectors, ("prepare", "seq2seq_tokenizer"),
          ("word2vec", "model", "seed")),
    pretraining_stage("seq2seq_pretrain", Seq2SeqPretraining(), pretraining_upstream, ("seq2seq", "pretrain")),
)
