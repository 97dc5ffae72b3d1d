"""Skip-Thought's encoder (models/skip_thought.py) as a HuggingFace directory: modeling_textrep_skip_thought.py beside
the word embeddings and the encoder's GRU weights. The decoders that trained it are left out: the directory computes
Skip-Thought vectors. Its tokenizer is data_prep's (data_prep/examples/skip_thought_examples.py save_hf_tokenizer)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from models.hf import write_custom_model
from models.skip_thought import QuickThoughts, SkipThoughts

if TYPE_CHECKING:  # never run (it needs transformers): the file is copied, and so part of the code version of
    # every stage that writes it (pipeline/engine/fingerprints.py follows imports)
    from models.hf import modeling_textrep_skip_thought  # noqa: F401

CUSTOM_CODE = "modeling_textrep_skip_thought"
CLASSES = {"AutoConfig": "TextrepSkipThoughtConfig", "AutoModel": "TextrepSkipThoughtModel"}


def to_hf(model: SkipThoughts | QuickThoughts, path) -> str:
    """Write the embeddings and the encoder of `model` (Quick-Thoughts: both, f and g) into `path`; returns the class
    AutoModel builds."""
    c = model.config
    state = {k: v for k, v in model.state_dict().items()
             if k.startswith(("embedding.", "encoder.", "context_encoder."))}
    config = {"architectures": [CLASSES["AutoModel"]], "model_type": "textrep_skip_thought",
              "vocab_size": c.vocab_size, "embedding_dim": c.embedding_dim, "encoder_dim": c.encoder_dim,
              "encoder": c.encoder, "objective": c.objective, "pad_token_id": c.pad_id}
    write_custom_model(Path(path), CUSTOM_CODE, config, CLASSES, state)
    return CLASSES["AutoModel"]


def describe(config: dict) -> str:
    """What a model card says of the encoder a to_hf directory's config.json describes."""
    dim, size = config["encoder_dim"], config["embedding_dim"]
    encoder = (f"one GRU of {dim} units (uni-skip)" if config["encoder"] == "uni" else
               f"a GRU over the sentence and one over it reversed, {dim // 2} units each (bi-skip)")
    if config.get("objective", "skip_thought") == "quick_thought":
        return (f"A Quick-Thoughts encoder pair (Logeswaran & Lee 2018), f and g, each {encoder}, over "
                f"{config['vocab_size']} word embeddings of {size} values. AutoModel gives the {2 * dim}-value vector "
                "[f(s); g(s)] of each sentence (`pooler_output`: the states after its <eos>) and both encoders' "
                "states at every token (`last_hidden_state`).")
    return (f"A Skip-Thought encoder (Kiros et al. 2015): {config['vocab_size']} word embeddings of {size} values, "
            f"{encoder}. AutoModel gives the {dim}-value Skip-Thought vector of each sentence (`pooler_output`: the "
            "state after its <eos>) and the encoder's state at every token (`last_hidden_state`); the two decoders "
            "that trained it are not included.")
