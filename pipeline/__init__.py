"""The pipeline: Hydra-configured stages (prepare → tokenizer → examples → pretrain → finetune → report)."""
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
