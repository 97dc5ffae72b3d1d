"""ELMo (Peters et al. 2018): its stages, the frozen biLM for `evaluate`, and feature-based fine-tuning beside its
control without ELMo."""
from omegaconf import DictConfig

from models.hf.elmo import describe
from pipeline.elmo.downstream import FINETUNE_KINDS, check_control
from pipeline.elmo.encoder import ENCODERS
from pipeline.elmo.pretrain import ELMO_STAGES
from pipeline.elmo.settings import ElmoConfig, ElmoFinetuneConfig
from pipeline.engine.family import Family, Tiny


def validate(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: elmo_w2v, the control, only where the heads read word vectors."""
    check_control(cfg, stages)


FAMILY = Family("elmo", stages=tuple(ELMO_STAGES), pretraining_stages=("elmo_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, config={"elmo": ElmoConfig, "finetune": ElmoFinetuneConfig},
                describe_export=describe, validate=validate,
                # the sampled softmax: its gradient is sparse
                tiny=Tiny("elmo_small", ("prepare", "elmo_vocab", "elmo_streams"), (
                    "elmo.vocab_size=200", "elmo.min_count=1", "elmo.batch_size=4", "elmo.window=8",
                    "elmo.holdout_books_fraction=0.2", "+model.config.lstm_dim=32", "+model.config.projection_dim=16",
                    "+model.config.filters=[[1,8],[2,8]]", "+model.config.softmax=sampled",
                    "+model.config.num_samples=50")))
