"""GPT (Radford et al. 2018; GPT-2): byte-level BPE, packed blocks and causal-LM pretraining, the frozen LM for
`evaluate`, GPT-1-style fine-tuning, and greedy samples in the report."""
from omegaconf import DictConfig

from models.hf.gpt import describe
from pipeline.engine.family import Family, Generation, Tiny
from pipeline.engine.snapshots import encoder_snapshot_steps
from pipeline.gpt import samples
from pipeline.gpt.downstream import FINETUNE_KINDS
from pipeline.gpt.encoder import ENCODERS
from pipeline.gpt.pretrain import GPT_STAGES, GPTPretraining
from pipeline.gpt.settings import GptConfig, GptFinetuneConfig, GptReportConfig


def validate(cfg: DictConfig, stages: list[str]) -> None:
    """A run that pretrains GPT snapshots it at steps GPT takes (pretrain.encoder_snapshots is checked against
    pretrain.max_steps, which in a run with BERT is BERT's); gpt.pretrain's numbers are checked as pretrain's, from
    their schema (GptConfig), with every block's."""
    if "gpt_pretrain" in stages:
        task = GPTPretraining()
        encoder_snapshot_steps(cfg, task.settings(cfg), task.settings_key(cfg))


FAMILY = Family("gpt", stages=GPT_STAGES, pretraining_stages=("gpt_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, report_upstream=samples.report_upstream,
                report_section=samples.report_section, validate=validate,
                config={"gpt": GptConfig, "finetune": GptFinetuneConfig, "report": GptReportConfig},
                describe_export=describe,
                generation=Generation(samples.STAGE, "gpt_tiny", samples.continue_texts, continues=True),
                tiny=Tiny("gpt_tiny", ("prepare", "gpt_tokenizer", "gpt_blocks"), (
                    "gpt.vocab_size=300", "gpt.min_frequency=1", "gpt.block_size=16", "+model.config.n_embd=32")))
