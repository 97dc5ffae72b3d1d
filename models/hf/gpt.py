"""GPT (models/gpt.py) as a HuggingFace directory is transformers' GPT2LMHeadModel, written by models.gpt.to_hf; what a
model card says of it."""
from __future__ import annotations


def describe(config: dict) -> str:
    """What a model card says of the model a models.gpt.to_hf directory's config.json describes."""
    return (f"A GPT-2-style causal language model (Radford et al. 2019): {config['n_layer']} pre-LayerNorm blocks, "
            f"hidden size {config['n_embd']}, {config['n_head']} attention heads, a context of "
            f"{config['n_positions']} tokens, {config['vocab_size']} byte-level BPE tokens, the output layer tied to "
            "the token embeddings. It is transformers' GPT2LMHeadModel: AutoModelForCausalLM gives next-token logits "
            "and `generate` continues a prompt.")
