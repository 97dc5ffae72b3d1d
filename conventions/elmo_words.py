"""ELMo's words, without torch: the split of text into words and the sentence markers every vocabulary starts with.
models/elmo.py encodes text with them and data_prep/examples/elmo_examples.py counts and streams words with them; its
Ray
workers import them alone, so that counting a shard's words never loads torch."""
from tokenizers import pre_tokenizers

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIAL_WORDS = (BOS, EOS, UNK)  # ids 0, 1, 2 of every vocabulary
BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_WORDS))

_PRE_TOKENIZER = pre_tokenizers.BertPreTokenizer()


def split_words(text: str) -> list[str]:
    """Whitespace and punctuation split (BERT's BasicTokenizer without lowercasing: the char-CNN sees case)."""
    return [word for word, _ in _PRE_TOKENIZER.pre_tokenize_str(text)]


def sentence_tokens(text: str) -> list[str]:
    return [BOS, *split_words(text), EOS]
