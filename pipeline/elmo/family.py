"""ELMo (Peters et al. 2018): its stages, the frozen biLM for `evaluate`, and feature-based fine-tuning."""
from pipeline.elmo.downstream import FINETUNE_KINDS
from pipeline.elmo.encoder import ENCODERS
from pipeline.elmo.stages import ELMO_STAGES
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT

FAMILY = Family("elmo", stages=tuple(ELMO_STAGES), pretraining_stages=("elmo_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS,
                numbers={"elmo.batch_size": POSITIVE_INT, "elmo.window": POSITIVE_INT,
                         "elmo.holdout_max_books": POSITIVE_INT})
