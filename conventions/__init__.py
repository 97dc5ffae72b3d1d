"""What the data functions write and the models read, defined once where both may import it: data_prep/ knows no model
and models/ no data function (tests/run/test_layering.py), and this package imports neither, nor torch.

IGNORE_INDEX and GPT_POOLINGS, here; ELMo's word split and special words (elmo_words.py); which rows of a piece-vector
table have a vector (piece_vectors.py)."""

# The target value every loss skips (padding, unmasked positions, a word's later sub-tokens): F.cross_entropy's
# default ignore_index. data_prep writes it into labels, models and pipeline compare against it.
IGNORE_INDEX = -100

# What GPT's sentence (pair) classifier reads of each input sequence: the models build it
# (models.gpt.GPTForSequenceClassification) and the pipeline's schema offers it (finetune.gpt_pooling), which loads no
# torch. last: the extract token's final state (GPT-1); mean: the mean of the final states of the sequence's tokens;
# last_embedding_mean: the extract state beside the mean of the sequence's token embeddings (normalised).
GPT_POOLINGS = ("last", "mean", "last_embedding_mean")
