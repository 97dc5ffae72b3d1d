"""The model families, listed once. A family is one folder, pipeline/<family>/, whose family.py exports its record
(pipeline/engine/family.py); adding one is that folder plus one line here."""
from pipeline.bert.family import FAMILY as BERT
from pipeline.elmo.family import FAMILY as ELMO
from pipeline.gpt.family import FAMILY as GPT
from pipeline.seq2seq.family import FAMILY as SEQ2SEQ
from pipeline.skip_thought.family import FAMILY as SKIP_THOUGHT

FAMILIES = (BERT, ELMO, SKIP_THOUGHT, GPT, SEQ2SEQ)
