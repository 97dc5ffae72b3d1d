"""ELMo (Peters et al. 2018): its stages, the frozen biLM for `evaluate`, and feature-based fine-tuning."""
from dataclasses import dataclass

from data_prep.examples.elmo_examples import SPECIAL_WORDS
from pipeline.elmo.downstream import FINETUNE_KINDS
from pipeline.elmo.encoder import ENCODERS
from pipeline.elmo.stages import ELMO_STAGES
from pipeline.engine.family import Family
from pipeline.engine.settings import POSITIVE_INT, Number


@dataclass
class ElmoConfig:
    """The `elmo` block (experiment=elmo_*): ELMo's word vocabulary and truncated-BPTT windows."""
    vocab_size: int = 20000
    min_count: int = 2
    window: int = 20  # bilm-tf's unroll_steps
    batch_size: int = 32
    holdout_books_fraction: float = 0.05  # whole books held out for perplexity
    holdout_max_books: int = 10  # and at most this many: every validation reads them all (5 % of BookCorpus: 552 books)


@dataclass
class ElmoFinetuneConfig:
    """What ELMo's feature-based fine-tuning adds to `finetune` (a key of that block, so that changing it reruns
    fine-tuning only, not the biLM's pretraining)."""
    # Dropout on the mixed ELMo vectors and in the task head. Peters et al. (2018) use 0.5 with tens of thousands of
    # labels; with 300 the head then cannot fit its own training sentences (docs/pretraining_recipes.md, ELMo)
    elmo_dropout: float = 0.5


FAMILY = Family("elmo", stages=tuple(ELMO_STAGES), pretraining_stages=("elmo_pretrain",), encoders=ENCODERS,
                finetune_kinds=FINETUNE_KINDS, config={"elmo": ElmoConfig, "finetune": ElmoFinetuneConfig},
                numbers={"elmo.vocab_size": Number(int, len(SPECIAL_WORDS) + 1, why=(
                             f"its special words {', '.join(SPECIAL_WORDS)} and at least one word")),
                         "elmo.batch_size": POSITIVE_INT, "elmo.window": POSITIVE_INT,
                         "elmo.holdout_max_books": POSITIVE_INT,
                         "finetune.elmo_dropout": Number(float, 0, 1, high_open=True, why="a dropout rate")})
