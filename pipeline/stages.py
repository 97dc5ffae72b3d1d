"""The pipeline's stages and their DAG; each writes into its own content-addressed directory (pipeline/dag.py),
linked from the run directory as `<run_dir>/<stage>`.

Data functions stay pure (data_prep/); this module maps them over shards with Ray and wires Lightning at the edge."""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import ray
from omegaconf import DictConfig

from data_prep.bert_examples import create_training_instances, write_instances
from data_prep.builtin import default_corpus
from data_prep.dedup import NearDuplicateOptions
from data_prep.prepare import list_corpus_files, prepare_corpus
from data_prep.shards import open_shards, shard_paths
from data_prep.tokenize_shards import encode_by_word, use_one_tokenizer_thread
from data_prep.tokenizer import load_tokenizer, train_wordpiece
from pipeline.dag import Stage, StageContext, all_cpus
from pipeline.distributed import stage_cpus
from pipeline.data import read_arrow
from pipeline.elmo_stages import ELMO_STAGES
from pipeline.evaluation import evaluate, evaluate_upstream
from pipeline.finetuning import finetune, finetune_upstream, task_names
from pipeline.pretraining import PHASES, encoder_stage, phase_of, pretrain
from pipeline.report import AttentionRequest, write_report
from pipeline.skip_thought_stages import SKIP_THOUGHT_STAGES
from pipeline.tasks import load_task, resolve_task_dir


def corpus_dir(cfg: DictConfig) -> Path:
    """The configured corpus, or the built-in one (downloaded on first use)."""
    return Path(cfg.data.corpus_dir).expanduser() if cfg.data.corpus_dir else default_corpus(cfg.paths.cache_dir)


def prepare(ctx: StageContext) -> dict:
    data = ctx.cfg.data
    corpus = corpus_dir(ctx.cfg)
    manifest = prepare_corpus(corpus, ctx.stage_dir("prepare"), glob=data.glob, input_format=data.input_format,
                              shard_bytes=int(data.shard_bytes), min_tokens=data.min_tokens,
                              max_tokens=data.max_tokens, nfkc=data.nfkc, num_workers=ctx.cfg.ray.num_cpus,
                              near_duplicates=None if data.near_duplicate_threshold is None
                              else NearDuplicateOptions(threshold=data.near_duplicate_threshold))
    return {"corpus_dir": str(corpus), **manifest["totals"]}


def tokenizer(ctx: StageContext) -> dict:
    table = open_shards(ctx.stage_dir("prepare"))
    # Record batches stream from the memory map: the trainer never holds the corpus as Python strings.
    sentences = (text for batch in table.to_batches() for text in batch.column("text").to_pylist())
    tok_cfg = ctx.cfg.tokenizer
    trained = train_wordpiece(sentences, ctx.stage_dir("tokenizer"), vocab_size=tok_cfg.vocab_size,
                              min_frequency=tok_cfg.min_frequency, lowercase=tok_cfg.lowercase)
    return {"vocab_size": trained.get_vocab_size()}


def _tokenized_books(shard_path: str, tok) -> list[list[list[int]]]:
    """The books of one sentence shard as lists of sentences of token ids, in shard order."""
    table = read_arrow(shard_path)
    ids = encode_by_word(tok, table.column("text").combine_chunks()).to_pylist()  # each distinct word encoded once
    books, current = [], None
    for book_id, sentence_ids in zip(table.column("book_id").to_pylist(), ids):
        if book_id != current:
            books.append([])
            current = book_id
        books[-1].append(sentence_ids)
    return books


@ray.remote(num_cpus=1)
def build_shard_examples(shard_path: str, neighbour_path: str, tokenizer_dir: str, out_path: str,
                         max_seq_length: int, short_seq_prob: float, dupe_factor: int, seed: int) -> int:
    """Tokenize one sentence shard and write its BERT sentence-pair instances.

    Random next sentences come from the shard's other books; a shard holding a single (long) book borrows the
    books of its neighbour shard for that, and only for that."""
    use_one_tokenizer_thread()
    tok = load_tokenizer(tokenizer_dir)
    books = _tokenized_books(shard_path, tok)
    borrowed = _tokenized_books(neighbour_path, tok) if len(books) < 2 and neighbour_path != shard_path else []
    instances = create_training_instances(books, max_seq_length, short_seq_prob, dupe_factor,
                                          random.Random(seed), random_next_documents=borrowed)
    write_instances(instances, out_path, tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]"))
    return len(instances)


def examples(ctx: StageContext) -> dict:
    """A pretraining phase's instances (`examples` at phase 1's length, `examples_phase2` at phase 2's), built from
    the same shards and tokenizer with the `examples` settings."""
    shards = shard_paths(ctx.stage_dir("prepare"))
    out = ctx.out_dir
    ex = ctx.cfg.examples
    max_seq_length = phase_of(ctx.name).max_seq_length(ctx.cfg)
    # One seed per shard, derived from the run seed: the output does not depend on which worker ran what.
    refs = [build_shard_examples.remote(str(shard), str(shards[(i + 1) % len(shards)]),
                                        str(ctx.stage_dir("tokenizer")), str(out / f"examples-{i:05d}.arrow"),
                                        max_seq_length, ex.short_seq_prob, ex.dupe_factor, ctx.cfg.seed * 1000 + i)
            for i, shard in enumerate(shards)]
    counts = ray.get(refs)
    return {"instances": int(sum(counts)), "files": len(counts), "max_seq_length": max_seq_length}


REPORTED_STAGES = (*(p.stage for p in PHASES), "elmo_pretrain", "skip_thought_pretrain", "finetune", "evaluate")


def _attention_request(cfg: DictConfig) -> AttentionRequest | None:
    wanted = cfg.report
    if not wanted.attention_sentence:
        return None
    return AttentionRequest(wanted.attention_sentence, wanted.attention_layer, wanted.attention_head)


def report_upstream(cfg: DictConfig) -> tuple[str, ...]:
    stages = tuple(s for s in REPORTED_STAGES if s in cfg.pipeline.stages)
    # The attention heat-map runs the pretrained BERT on a sentence, so it needs that BERT's tokenizer as well.
    if encoder_stage(cfg) in stages and _attention_request(cfg) is not None:
        stages += ("tokenizer",)
    return stages


def report(ctx: StageContext) -> dict:
    upstream = report_upstream(ctx.cfg)
    paths = write_report({name: ctx.stage_dir(name) for name in upstream}, ctx.out_dir,
                         title=ctx.cfg.experiment_name,
                         attention=_attention_request(ctx.cfg) if "tokenizer" in upstream else None,
                         attention_stage=encoder_stage(ctx.cfg), wandb_run=ctx.wandb_run)
    return {k: str(v) for k, v in paths.items()}


def _files_fingerprint(root: Path, pattern: str) -> str:
    """Names, sizes and modification times of the input files, listed as prepare lists them: a changed corpus is
    new work."""
    listing = []
    for name in list_corpus_files(root, pattern):
        try:
            info = (root / name).stat()
            listing.append((name, info.st_size, info.st_mtime_ns))
        except OSError:  # a broken link, rejected by prepare: repairing it must rerun prepare
            listing.append((name, None, None))
    return hashlib.sha256(json.dumps([str(root), listing]).encode()).hexdigest()


def _corpus_fingerprint(cfg: DictConfig) -> str:
    return _files_fingerprint(corpus_dir(cfg), cfg.data.glob)


def _finetune_fingerprint(cfg: DictConfig) -> str:
    """The task files and, when fine-tuning an external encoder, its files."""
    parts = [_files_fingerprint(resolve_task_dir(load_task(name), cfg.finetune.data_dir, cfg.paths.cache_dir), "*")
             for name in task_names(cfg)]
    if "external" in cfg.finetune.models and cfg.finetune.external_encoder:
        parts.append(_files_fingerprint(Path(cfg.finetune.external_encoder).expanduser(), "*"))
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def _senteval_fingerprint(cfg: DictConfig) -> str:
    root = Path(str(cfg.senteval.data_root)).expanduser()
    return hashlib.sha256("".join(_files_fingerprint(root / str(t.path), "*") if (root / str(t.path)).is_dir()
                                  else _files_fingerprint((root / str(t.path)).parent, (root / str(t.path)).name)
                                  for t in cfg.senteval.tasks.values()).encode()).hexdigest()


# The DAG, declared once: (name, function, upstream stages, config keys that decide the output, code version).
STAGES: dict[str, Stage] = {s.name: s for s in [
    # version 4: decodes UTF-16/32 books, keeps books with a few stray NULs
    Stage("prepare", prepare, (), ("data",), version=4, fingerprint=_corpus_fingerprint),
    Stage("tokenizer", tokenizer, ("prepare",), ("tokenizer",), version=1),
    Stage("examples", examples, ("prepare", "tokenizer"), ("examples", "seed"), version=1),
    # BERT's phase 2 (pipeline/pretraining.py, PHASES): its own examples, and phase 1's weights to continue from
    Stage("examples_phase2", examples, ("prepare", "tokenizer"),
          ("examples", "pretrain_phase2.max_seq_length", "seed"), version=1),
    # version 3: writes the MLM/NSP heads too, which phase 2 continues from
    Stage("pretrain", pretrain, ("tokenizer", "examples"), ("model", "pretrain", "trainer", "seed"), version=3,
          num_cpus=stage_cpus),
    Stage("pretrain_phase2", pretrain, ("tokenizer", "examples_phase2", "pretrain"),
          ("model", "pretrain", "pretrain_phase2", "trainer", "seed"), version=1, num_cpus=stage_cpus),
    Stage("finetune", finetune, finetune_upstream, ("finetune", "trainer", "seed"), version=1,
          fingerprint=_finetune_fingerprint, num_cpus=all_cpus),
    Stage("evaluate", evaluate, evaluate_upstream, ("evaluate", "senteval", "seed"), version=1,
          fingerprint=_senteval_fingerprint, num_cpus=all_cpus),
    *ELMO_STAGES,
    *SKIP_THOUGHT_STAGES,
    Stage("report", report, report_upstream, ("experiment_name", "report"), version=2),
]}
