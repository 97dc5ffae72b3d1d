"""Skip-Thought (Kiros et al. 2015): its stages, uni-skip's and bi-skip's pretraining among them (or Quick-Thoughts',
skip_thought.objective), and the trained encoders, combine-skip too, for `evaluate` and, frozen under a linear model,
for `finetune`, beside their random twins and their controls."""
from omegaconf import DictConfig

from models.hf.skip_thought import describe
from pipeline.downstream.settings import finetune_settings
from pipeline.engine.family import Family, Tiny
from pipeline.skip_thought.downstream import FINETUNE_KINDS
from pipeline.skip_thought.encoder import ENCODERS
from pipeline.skip_thought.pretrain import (
    PRETRAINING_STAGES,
    SKIP_THOUGHT_STAGES,
    check_embedding_width,
    starts_from_word2vec,
)
from pipeline.skip_thought.settings import SkipThoughtConfig


def validate(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: an encoder kind or objective in the model config would be overridden by the stage's,
    unseen; one checkpoint (ckpt_path) cannot start both encoders' training; word embeddings that start from word2vec
    have its width."""
    in_run = [stage for stage in PRETRAINING_STAGES.values() if stage in stages]
    if cfg.ckpt_path and len(in_run) > 1:
        raise ValueError(f"ckpt_path={cfg.ckpt_path} would start both {', '.join(in_run)}, which train different "
                         "models; run the stage it belongs to alone (pipeline.stages), or leave ckpt_path null")
    model_config = cfg.model.config
    if in_run and "encoder" in model_config:
        raise ValueError(f"model.config.encoder={model_config.encoder}: each Skip-Thought pretraining stage trains "
                         f"its own encoder ({', '.join(f'{s}: {e}' for e, s in PRETRAINING_STAGES.items())}); drop "
                         "the setting and put the stage you want in pipeline.stages")
    if in_run and "objective" in model_config:
        raise ValueError(f"model.config.objective={model_config.objective}: the pretraining stages set it from "
                         "skip_thought.objective; drop the model setting and set skip_thought.objective instead")
    # the control kinds build the starting model without a pretraining stage
    controls = "finetune" in stages and any(name in FINETUNE_KINDS and FINETUNE_KINDS[name].control_of
                                            for name in finetune_settings(cfg).models)
    if (in_run or controls) and starts_from_word2vec(cfg):
        check_embedding_width(cfg)


FAMILY = Family("skip_thought", stages=tuple(SKIP_THOUGHT_STAGES),
                pretraining_stages=tuple(PRETRAINING_STAGES.values()), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, validate=validate, describe_export=describe,
                # batches of 16 of ~300 triples: 30 steps cross an epoch
                tiny=Tiny("skip_thought_small", ("prepare", "skip_thought_vocab", "skip_thought_examples"), (
                    "skip_thought.vocab_size=200", "pretrain.batch_size=16", "++model.config.embedding_dim=16",
                    "+model.config.encoder_dim=32", "+model.config.decoder_dim=32")),
                config={"skip_thought": SkipThoughtConfig})
