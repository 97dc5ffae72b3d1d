"""The `evaluate` block's schema, apart from the stage (pipeline/evaluation/stage.py), which reads the families'
encoders: the schema imports no registry. pipeline/config.py narrows `encoders` to the names the stage offers where it
builds the root schema, so a name no family offers fails at composition, naming the key."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EvaluateConfig:
    # frozen encoders compared by the SentEval-style probes (the `senteval` block); *_random: the same architecture,
    # untrained; names: pipeline/evaluation/stage.py ENCODERS (glove_bow and the families' Family.encoders)
    encoders: list[str] = field(default_factory=lambda: [
        "bert_cls", "bert_mean", "bert_cls_random", "bert_mean_random", "glove_bow"])
