"""What a run's pretrained encoder-decoder writes from source texts: `python -m pipeline.generate RUN_DIR --input`."""
from __future__ import annotations

from pathlib import Path

from data_prep.examples.seq2seq_examples import load_seq2seq_tokenizer
from models.kernels import use_fast_kernels
from pipeline.engine.generation import Request, complete_characters, generate_tokens
from pipeline.seq2seq.architectures import load_model


def write_outputs(model_dir: Path, sources: list[str], request: Request, fast_kernels: bool) -> list[list[str]]:
    """Each source's outputs (the `beams` best for beam search, best first) by the encoder-decoder in `model_dir`,
    each source ended by the end token as its pretraining sources were and cut to the positions it was trained on;
    decoded with models/kernels.py's kernels where `fast_kernels` (Generation.write)."""
    if not all(source.strip() for source in sources):
        raise ValueError("an input is empty: give some text to generate from")
    model, tokenizer = load_model(model_dir).eval(), load_seq2seq_tokenizer(model_dir)
    if fast_kernels:
        use_fast_kernels(model)
    eos, length = model.config.eos_token_id, model.config.max_positions - 1
    return [[complete_characters(tokenizer.decode([t for t in tokens if t != eos]))
             for tokens in generate_tokens(model, [*tokenizer.encode(source).ids[:length], eos], request)]
            for source in sources]
