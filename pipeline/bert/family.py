"""BERT (Devlin et al. 2019): its data and two-phase pretraining stages, frozen encoders for `evaluate`, end-to-end
fine-tuning, and the attention heat-map in the report."""
from pipeline.bert import attention
from pipeline.bert.downstream import FINETUNE_KINDS
from pipeline.bert.encoder import ENCODERS
from pipeline.bert.pretrain import PHASES, validate
from pipeline.bert.stages import BERT_STAGES
from pipeline.engine.family import Family

FAMILY = Family("bert", stages=BERT_STAGES, pretraining_stages=tuple(p.stage for p in PHASES), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=attention.report_upstream,
                report_section=attention.report_section, validate=validate)
