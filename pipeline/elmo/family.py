"""ELMo (Peters et al. 2018): its stages, the frozen biLM for `evaluate`, and feature-based fine-tuning beside its
control without ELMo."""
from data_prep.examples.elmo_examples import SPECIAL_WORDS
from pipeline.elmo.downstream import FINETUNE_KINDS, check_control
from pipeline.elmo.encoder import ENCODERS
from pipeline.elmo.settings import ElmoConfig, ElmoFinetuneConfig
from pipeline.elmo.stages import ELMO_STAGES
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number

FAMILY = Family("elmo", stages=tuple(ELMO_STAGES), pretraining_stages=("elmo_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, validate=check_control,
                config={"elmo": ElmoConfig, "finetune": ElmoFinetuneConfig},
                numbers={"elmo.vocab_size": Number(int, len(SPECIAL_WORDS) + 1, why=(
                             f"its special words {', '.join(SPECIAL_WORDS)} and at least one word")),
                         "elmo.batch_size": POSITIVE_INT, "elmo.window": POSITIVE_INT,
                         "elmo.holdout_max_books": POSITIVE_INT,
                         "finetune.elmo_dropout": Number(float, 0, 1, high_open=True, why="a dropout rate")})
