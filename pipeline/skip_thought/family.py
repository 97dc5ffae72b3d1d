"""Skip-Thought (Kiros et al. 2015): its stages, uni-skip's and bi-skip's pretraining among them, and the trained
encoders, combine-skip too, for `evaluate` and, frozen under a linear model, for `finetune`."""
from omegaconf import DictConfig

from models.hf.skip_thought import describe
from pipeline.engine.family import Family, Tiny
from pipeline.skip_thought.downstream import FINETUNE_KINDS
from pipeline.skip_thought.encoder import ENCODERS
from pipeline.skip_thought.pretrain import PRETRAINING_STAGES, SKIP_THOUGHT_STAGES
from pipeline.skip_thought.settings import SkipThoughtConfig


def validate(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: an encoder kind in the model config would be overridden by the stage's, unseen; one
    checkpoint (ckpt_path) cannot start both encoders' training."""
    in_run = [stage for stage in PRETRAINING_STAGES.values() if stage in stages]
    if cfg.ckpt_path and len(in_run) > 1:
        raise ValueError(f"ckpt_path={cfg.ckpt_path} would start both {', '.join(in_run)}, which train different "
                         "models; run the stage it belongs to alone (pipeline.stages), or leave ckpt_path null")
    if in_run and "encoder" in cfg.model.config:
        raise ValueError(f"model.config.encoder={cfg.model.config.encoder}: each Skip-Thought pretraining stage trains "
                         f"its own encoder ({', '.join(f'{s}: {e}' for e, s in PRETRAINING_STAGES.items())}); drop "
                         "the setting and put the stage you want in pipeline.stages")


FAMILY = Family("skip_thought", stages=tuple(SKIP_THOUGHT_STAGES),
                pretraining_stages=tuple(PRETRAINING_STAGES.values()), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, validate=validate, describe_export=describe,
                # batches of 16 of ~300 triples: 30 steps cross an epoch
                tiny=Tiny("skip_thought_small", ("prepare", "skip_thought_vocab", "skip_thought_examples"), (
                    "skip_thought.vocab_size=200", "pretrain.batch_size=16", "+model.config.embedding_dim=16",
                    "+model.config.encoder_dim=32", "+model.config.decoder_dim=32")),
                config={"skip_thought": SkipThoughtConfig})
