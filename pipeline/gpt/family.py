"""GPT (Radford et al. 2018; GPT-2): byte-level BPE, packed blocks and causal-LM pretraining, the frozen LM for
`evaluate`."""
from pipeline.engine.family import Family
from pipeline.gpt.encoder import ENCODERS
from pipeline.gpt.stages import GPT_STAGES

FAMILY = Family("gpt", stages=GPT_STAGES, pretraining_stages=("gpt_pretrain",), encoders=ENCODERS)
