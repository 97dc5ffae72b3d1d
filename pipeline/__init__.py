"""The pipeline: Hydra-configured stages (prepare → bert_tokenizer → bert_examples → bert_pretrain → finetune →
report)."""
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
