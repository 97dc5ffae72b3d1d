"""BERT (Devlin et al. 2019): its data and two-phase pretraining stages, frozen encoders for `evaluate`, end-to-end
fine-tuning, and the attention heat-map in the report."""
from omegaconf import DictConfig

from models.hf.bert import describe
from pipeline.bert import attention
from pipeline.bert.downstream import FINETUNE_KINDS, check_prompts
from pipeline.bert.encoder import ENCODERS
from pipeline.bert.pretrain import BERT_STAGES, PHASES, validate_pretraining
from pipeline.bert.settings import CONFIG
from pipeline.engine.family import Family, Tiny


def validate(cfg: DictConfig, stages: list[str]) -> None:
    """Before any stage runs: the pretraining phases of the run, and the prompts its fine-tuning reads."""
    validate_pretraining(cfg, stages)
    check_prompts(cfg, stages)


FAMILY = Family("bert", stages=BERT_STAGES, pretraining_stages=tuple(p.stage for p in PHASES), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=attention.report_upstream,
                report_section=attention.report_section, validate=validate, config=CONFIG, describe_export=describe,
                tiny=Tiny("bert_tiny", ("prepare", "bert_tokenizer", "bert_examples")))
