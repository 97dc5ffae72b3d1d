"""BERT (Devlin et al. 2019): its data and two-phase pretraining stages, frozen encoders for `evaluate`, end-to-end
fine-tuning, and the attention heat-map in the report."""
from omegaconf import DictConfig

from data_prep.corpus.tokenizer import SPECIAL_TOKENS
from data_prep.examples.bert_examples import NUM_SPECIAL_TOKENS_IN_PAIR
from models.hf.bert import describe
from pipeline.bert import attention
from pipeline.bert.downstream import FINETUNE_KINDS, check_prompts
from pipeline.bert.encoder import ENCODERS
from pipeline.bert.pretrain import BERT_STAGES, PHASES, validate_pretraining
from pipeline.bert.settings import CONFIG
from pipeline.engine.family import Family, Tiny
from pipeline.engine.settings import COUNT, FRACTION, POSITIVE_INT, RATE, Number

# The shortest sentence pair: [CLS] a [SEP] b [SEP], a token on each side (google-research/bert's
# create_instances_from_document needs two); a shorter examples.max_seq_length failed in the bert_examples stage.
MIN_PAIR_LENGTH = NUM_SPECIAL_TOKENS_IN_PAIR + 2
PAIR_LENGTH = Number(int, MIN_PAIR_LENGTH, why="[CLS] a [SEP] b [SEP] with a token on each side")


def validate(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: the pretraining phases of the run, and the prompts its fine-tuning reads."""
    validate_pretraining(cfg, stages)
    check_prompts(cfg, stages)


FAMILY = Family("bert", stages=BERT_STAGES, pretraining_stages=tuple(p.stage for p in PHASES), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=attention.report_upstream,
                report_section=attention.report_section, validate=validate, config=CONFIG, describe_export=describe,
                tiny=Tiny("bert_tiny", ("prepare", "bert_tokenizer", "bert_examples")), numbers={
                    "tokenizer.vocab_size": Number(int, len(SPECIAL_TOKENS) + 1, why=(
                        f"{len(SPECIAL_TOKENS)} special tokens and at least one word piece; the bert_tokenizer stage "
                        "refuses a vocabulary too small for the corpus's characters")),
                    "tokenizer.max_sentences": Number(int, 1, nullable=True),
                    "examples.max_seq_length": PAIR_LENGTH,
                    "examples.dupe_factor": POSITIVE_INT, "examples.short_seq_prob": FRACTION,
                    "pretrain.mlm_probability": Number(float, 0, 1, low_open=True),
                    "pretrain.contrastive_weight": Number(float, 0),
                    "pretrain.contrastive_temperature": Number(float, 0, low_open=True),
                    "pretrain.max_predictions_per_seq": POSITIVE_INT, "pretrain_phase2.max_seq_length": PAIR_LENGTH,
                    "pretrain_phase2.max_steps": POSITIVE_INT, "pretrain_phase2.batch_size": POSITIVE_INT,
                    "pretrain_phase2.lr": RATE, "pretrain_phase2.warmup_steps": COUNT})
