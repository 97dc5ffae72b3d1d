"""ELMo's blocks, typed: `elmo`, which its data stages read, in a module without torch, which the Ray workers of
those stages never load (tests/run/test_layering.py), and what it adds to `finetune`."""
from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from conventions.elmo_words import SPECIAL_WORDS
from pipeline.engine.settings import POSITIVE_INT, Number, ranged

# What the task heads read beside the biLM's mix: the word2vec stage's vectors of the vocabulary's words, or nothing
WORD_VECTORS = ("word2vec", "none")
WordVectorSource = StrEnum("WordVectorSource", {name: name for name in WORD_VECTORS}, module=__name__)


@dataclass
class ElmoConfig:
    """The `elmo` block (experiment=elmo_*): ELMo's word vocabulary and truncated-BPTT windows."""
    vocab_size: int = ranged(20000, Number(int, len(SPECIAL_WORDS) + 1, why=(
        f"its special words {', '.join(SPECIAL_WORDS)} and at least one word")))
    min_count: int = 2
    window: int = ranged(20, POSITIVE_INT)  # bilm-tf's unroll_steps
    batch_size: int = ranged(32, POSITIVE_INT)
    holdout_books_fraction: float = 0.05  # whole books held out for perplexity
    # and at most this many: every validation reads them all (5 % of BookCorpus: 552 books)
    holdout_max_books: int = ranged(10, POSITIVE_INT)


@dataclass
class ElmoFinetuneConfig:
    """What ELMo's feature-based fine-tuning adds to `finetune` (a key of that block, so that changing it reruns
    fine-tuning only, not the biLM's pretraining)."""
    # Dropout on the mixed ELMo vectors and in the task head. Peters et al. (2018) use 0.5 with tens of thousands of
    # labels; with 300 the head then cannot fit its own training sentences (docs/history/pretraining_recipes_log.md,
    # "Every family on the reviews")
    elmo_dropout: float = ranged(0.5, Number(float, 0, 1, high_open=True, why="a dropout rate"))
    # Dropout on the mixed ELMo vectors alone (the head's stays elmo_dropout); null: elmo_dropout there too. Peters et
    # al. (§3.3) add dropout to ELMo itself; beside the word vectors, dropping the mix's values and not the vectors'
    # makes the head lean on the vectors as well
    elmo_mix_dropout: Optional[float] = ranged(None, Number(float, 0, 1, high_open=True, nullable=True,
                                                            why="a dropout rate"))
    # ELMo's γ (Peters et al. eq. 1), the mix's learned scale, at the start of fine-tuning: 1 in the paper and in
    # AllenNLP. Beside the task model's own word vectors that start made the head 14 points worse than those vectors
    # alone (docs/pretraining_recipes.md, "ELMo with the paper's protocol"): the small biLM's layers are large (standard
    # deviation 4.9 for the word layer) and the head fits them before the vectors. 0 starts the head as its control
    # elmo_w2v, the mix adding nothing at step 0 (where only γ has a gradient), and γ grows as far as the task's
    # gradient takes it
    elmo_gamma_init: float = ranged(1.0, Number(float, 0, why="the mix's scale at the start; 0: none"))
    # Each biLM layer normalised over its values before the mix (Peters et al. §3.2, "in some cases it helped";
    # AllenNLP's do_layer_norm): here the layers' scales differ up to eightfold (4.9 against 0.6-0.9)
    elmo_layer_norm: bool = False
    # The task heads' input beside the mix: Peters et al. (2018, §3.3, Table 1) concatenate ELMo with the task model's
    # own pretrained word vectors (GloVe there, kept fixed) and state ELMo's gain over that model without ELMo;
    # word2vec: the word2vec stage's vectors (skip-gram on the same corpus), frozen, which then also fine-tunes the
    # control elmo_w2v (finetune.controls); none: the mix alone, with elmo_random as the control
    elmo_word_vectors: WordVectorSource = WordVectorSource.word2vec
