"""BERT's stages: the data stages (pipeline/bert/data_stages.py), then pretraining in one or two phases."""
from __future__ import annotations

from functools import partial

from data_prep.corpus.tokenizer import load_tokenizer
from pipeline.bert.data_stages import embedding_width, examples, tokenizer, wordpiece_ids
from pipeline.bert.pretrain import PHASES, PRETRAINING, init_from_fingerprint, pretraining_upstream
from pipeline.engine.dag import Stage
from pipeline.engine.pretraining import pretraining_stage
from pipeline.piece_vectors import piece_vectors

PHASE_1, PHASE_2 = PHASES
BERT_STAGES = (
    # with pretrain.init_from, the checkpoint's tokenizer: its files are the stage's input (and, through this stage,
    # the weights pretrain reads from the same directory)
    Stage("bert_tokenizer", tokenizer, ("prepare",), ("tokenizer", "pretrain.init_from"),
          fingerprint=init_from_fingerprint),
    Stage(PHASE_1.examples, partial(examples, length_key=PHASE_1.length_key), ("prepare", "bert_tokenizer"),
          ("examples", "seed")),
    # pretrain.init_embeddings=word2vec: skip-gram vectors of the WordPiece pieces, the word embeddings' start
    Stage("bert_piece_vectors", partial(piece_vectors, tokenizer_stage="bert_tokenizer", load_tokenizer=load_tokenizer,
                                        encode=wordpiece_ids, width=embedding_width),
          ("prepare", "bert_tokenizer"), ("word2vec", "model", "seed")),
    # phase 2 (Devlin et al. §A.2; PHASES in pipeline/bert/pretrain.py): its own examples, and phase 1's weights
    Stage(PHASE_2.examples, partial(examples, length_key=PHASE_2.length_key), ("prepare", "bert_tokenizer"),
          ("examples", PHASE_2.length_key, "seed")),
    pretraining_stage(PHASE_1.stage, PRETRAINING[PHASE_1.stage], partial(pretraining_upstream, PHASE_1),
                      ("pretrain",)),
    pretraining_stage(PHASE_2.stage, PRETRAINING[PHASE_2.stage], partial(pretraining_upstream, PHASE_2),
                      ("pretrain", "pretrain_phase2")),
)
