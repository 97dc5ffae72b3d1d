"""The GPU check's phases (benchmarks/gpu_check.py lists them), each a function of a PhaseContext that returns its
rows, and what they share: the shapes of a run, the device, a deadline, timing, memory. One file of ten
measurements that time the same kind of step the same way; the runner, arithmetic and report are apart."""
from __future__ import annotations

import gc
import json
import re
import resource
import statistics
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from gpu_flops import bert_step_flops, gpt_step_flops

from pipeline.engine.training import cpu_computes_bf16

BERT_BATCHES = (256, 128, 64, 32)  # phase 1 of BERT (Devlin et al. 2019, Sec. A.2): 256 sequences of 128 tokens
GPT_BATCHES = (32, 16, 8, 4)  # GPT-small at 1024 tokens: the first that fits
GPT_VOCAB = 50304  # GPT-2's 50,257 padded to a multiple of 64, as nanoGPT trains it


@dataclass(frozen=True)
class Sizes:
    """The shapes of one run: the real ones on a GPU, tiny ones with --quick."""
    bert: str
    bert_seq: int
    bert_batches: tuple[int, ...]
    gpt: str
    gpt_seq: int
    gpt_batches: tuple[int, ...]
    gpt_vocab: int
    elmo: tuple[str, int, int, int]  # size, vocabulary, batch, window
    skip_thought: tuple[str, int, int, int]  # size, vocabulary, batch, sentence length
    harness_experiment: str
    harness_batch: int
    harness_steps: tuple[int, int]  # warm-up steps, timed steps
    decode: tuple[int, int]  # prompt tokens, new tokens
    warmup: int
    steps: int
    peak_n: int


FULL = Sizes(bert="bert_base", bert_seq=128, bert_batches=BERT_BATCHES, gpt="gpt_small", gpt_seq=1024,
             gpt_batches=GPT_BATCHES, gpt_vocab=GPT_VOCAB, elmo=("elmo_original", 793471, 128, 20),
             skip_thought=("skip_thought_paper", 20000, 128, 30), harness_experiment="bert_base", harness_batch=256,
             harness_steps=(10, 30), decode=(32, 128), warmup=3, steps=10, peak_n=8192)
QUICK = Sizes(bert="bert_tiny", bert_seq=32, bert_batches=(4,), gpt="gpt_tiny", gpt_seq=32, gpt_batches=(2,),
              gpt_vocab=512, elmo=("elmo_small", 1000, 4, 8), skip_thought=("skip_thought_small", 1000, 4, 8),
              harness_experiment="bert_tiny", harness_batch=8, harness_steps=(3, 5), decode=(4, 8), warmup=1,
              steps=2, peak_n=256)


@dataclass
class PhaseContext:
    device: torch.device
    sizes: Sizes
    quick: bool
    deadline: float  # time.perf_counter() by which the phase wraps up
    work_dir: Path

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def autocast(self):
        """bf16 autocast where the device computes bf16 natively; fp32 on a CPU without (the script's check alone)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()

    @property
    def bf16(self) -> bool:
        return self.cuda or cpu_computes_bf16()

    @property
    def dtype(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def reset_memory(self) -> None:
        gc.collect()  # what an earlier measurement left: its models and optimizer states
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_memory_gib(self) -> float:
        """The GPU's allocated peak since reset_memory; on a CPU the process's peak resident memory."""
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2 ** 30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20

    def time_steps(self, step, warmup: int | None = None, steps: int | None = None) -> dict:
        """First step's seconds (compilation included) and mean seconds of the timed steps after `warmup`, synchronised
        at both ends only (the device runs ahead of Python as in training); fewer steps if the deadline comes."""
        warmup = self.sizes.warmup if warmup is None else warmup
        steps = self.sizes.steps if steps is None else steps
        started = time.perf_counter()
        step()
        self.sync()
        first = time.perf_counter() - started
        for _ in range(warmup - 1):
            step()
        self.sync()
        started, done = time.perf_counter(), 0
        while done < steps and (done < 2 or time.perf_counter() < self.deadline):
            step()
            done += 1
        self.sync()
        return {"first_step_s": first, "step_s": (time.perf_counter() - started) / done, "timed_steps": done}


def row(ctx: PhaseContext, model: str, impl: str, batch: int, seq: int, timing: dict, flops_per_step: float | None,
        **extra) -> dict:
    return {"model": model, "impl": impl, "batch": batch, "seq": seq, "dtype": ctx.dtype,
            "tokens_per_s": batch * seq / timing["step_s"], "sequences_per_s": batch / timing["step_s"],
            "flops_per_step": flops_per_step, "peak_mem_gib": ctx.peak_memory_gib(), **timing, **extra}


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def train_step(ctx: PhaseContext, model, loss_fn, batch: dict):
    """forward + loss under autocast, backward, fused AdamW update, zero_grad: the step both sides are timed on."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    def step():
        with ctx.autocast():
            loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def largest_batch(ctx: PhaseContext, batches: tuple[int, ...], build_and_step) -> tuple[int, object]:
    """The first of `batches` whose step runs without running out of memory: (batch, what build_and_step returned)."""
    for batch in batches:
        ctx.reset_memory()
        try:
            return batch, build_and_step(batch)
        except RuntimeError as error:
            if not is_out_of_memory(error) or batch == batches[-1]:
                raise
            print(f"  batch {batch} does not fit: trying {batches[batches.index(batch) + 1]}", flush=True)
    raise AssertionError("unreachable")


def phase_peak(ctx: PhaseContext) -> list[dict]:
    """Best bf16 and fp32 (TF32 off) n x n matmul throughput within a few seconds each."""
    n, rows = ctx.sizes.peak_n, []
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        if dtype == torch.bfloat16 and not ctx.bf16:
            continue
        a, b = (torch.randn(n, n, device=ctx.device).to(dtype) for _ in range(2))
        a @ b
        ctx.sync()
        best, until = 0.0, time.perf_counter() + (1.0 if ctx.quick else 3.0)
        while time.perf_counter() < until:
            started = time.perf_counter()
            for _ in range(5):
                a @ b
            ctx.sync()
            best = max(best, 5 * 2 * n ** 3 / (time.perf_counter() - started))
        rows.append({"model": "matmul", "impl": f"{n}^3 torch.mm", "dtype": name,
                     "matmul_flops_per_s": best})
    return rows


def phase_bert(ctx: PhaseContext, compiled: bool = False) -> list[dict]:
    import transformers
    from bench_train import MAX_PREDICTIONS, VOCAB_SIZE, huggingface, make_batch

    from models import IGNORE_INDEX
    from models.bert import BertForPreTraining, bert_config
    from models.kernels import use_fast_kernels
    from pipeline.bert.module import bert_pretraining_losses

    transformers.logging.set_verbosity_error()
    s, rows = ctx.sizes, []
    c = bert_config(s.bert, vocab_size=VOCAB_SIZE)
    name = "BERT-base" if s.bert == "bert_base" else s.bert

    def ours(batch_size: int):
        torch.manual_seed(0)
        model = use_fast_kernels(BertForPreTraining(c)).to(ctx.device)  # as the pipeline builds it
        if compiled:
            model.compile()  # what trainer.compile=true does (pipeline.engine.training.compile_network)
        batch = {k: v.to(ctx.device) for k, v in make_batch(batch_size, s.bert_seq).items()}
        step = train_step(ctx, model, lambda m, b: bert_pretraining_losses(m, b)["loss"], batch)
        return int((batch["mlm_labels"] != IGNORE_INDEX).sum()), ctx.time_steps(step)

    # the model and its optimizer state go with ours(): HF's peak memory is its own
    batch_size, (masked, timing) = largest_batch(ctx, s.bert_batches, ours)
    flops = bert_step_flops(c.num_hidden_layers, c.hidden_size, c.intermediate_size, VOCAB_SIZE, batch_size,
                            s.bert_seq, masked)
    rows.append(row(ctx, name, "ours + torch.compile" if compiled else "ours", batch_size, s.bert_seq, timing, flops,
                    masked_per_seq=masked / batch_size, max_predictions=MAX_PREDICTIONS))
    if compiled:
        return rows
    ctx.reset_memory()
    torch.manual_seed(0)
    model, loss = huggingface(s.bert, "sdpa")
    model.to(ctx.device)

    def hf(hf_batch_size: int):
        batch = {k: v.to(ctx.device) for k, v in make_batch(hf_batch_size, s.bert_seq).items()}
        return ctx.time_steps(train_step(ctx, model, lambda m, b: loss(b), batch))

    hf_batch_size, timing = largest_batch(ctx, tuple(b for b in s.bert_batches if b <= batch_size), hf)
    rows.append(row(ctx, name, "HF BertForPreTraining (sdpa)", hf_batch_size, s.bert_seq, timing,
                    flops * hf_batch_size // batch_size, **smaller_batch_note(hf_batch_size, batch_size)))
    return rows


def smaller_batch_note(batch_size: int, ours: int) -> dict:
    """HF's row at a smaller batch than ours (its own ran out of memory): said, and no ratio is drawn from it."""
    return {"note": f"ran out of memory at batch {ours}"} if batch_size < ours else {}


def phase_bert_compile(ctx: PhaseContext) -> list[dict]:
    return phase_bert(ctx, compiled=True)


def _gpt_models(ctx: PhaseContext, with_hf: bool = True):
    """Ours from the seed and, with_hf, HF's GPT2LMHeadModel (sdpa) holding the same weights."""
    import transformers

    from models.gpt import GPTLMHeadModel, gpt_config
    from models.hf.gpt import to_hf
    from models.kernels import use_fast_kernels

    transformers.logging.set_verbosity_error()  # its notes on loading and generation settings
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    ours = use_fast_kernels(GPTLMHeadModel(gpt_config(ctx.sizes.gpt, vocab_size=ctx.sizes.gpt_vocab,
                                                      eos_token_id=None)))  # as the pipeline runs it
    hf = None
    if with_hf:
        with tempfile.TemporaryDirectory() as hf_dir:
            to_hf(ours, hf_dir)
            hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="sdpa")
    return ours, hf


def _gpt_batch(ctx: PhaseContext, batch_size: int) -> dict:
    g = torch.Generator().manual_seed(0)
    block = torch.randint(0, ctx.sizes.gpt_vocab, (batch_size, ctx.sizes.gpt_seq + 1), generator=g)
    return {"input_ids": block[:, :-1].contiguous().to(ctx.device),
            "targets": block[:, 1:].contiguous().to(ctx.device)}


def phase_gpt(ctx: PhaseContext, compiled: bool = False) -> list[dict]:
    s = ctx.sizes
    ours, hf = _gpt_models(ctx, with_hf=not compiled)
    c = ours.config
    name = "GPT-small (124M)" if s.gpt == "gpt_small" else s.gpt
    ours.to(ctx.device)
    if compiled:
        ours.compile()

    def run_ours(batch_size: int):
        batch = _gpt_batch(ctx, batch_size)
        return ctx.time_steps(train_step(ctx, ours, lambda m, b: m(b["input_ids"], b["targets"]).loss, batch))

    batch_size, timing = largest_batch(ctx, s.gpt_batches, run_ours)
    flops = gpt_step_flops(c.n_layer, c.n_embd, c.vocab_size, batch_size, s.gpt_seq)
    rows = [row(ctx, name, "ours + torch.compile" if compiled else "ours", batch_size, s.gpt_seq, timing, flops)]
    if compiled:
        return rows
    ours.cpu()
    ctx.reset_memory()
    hf.to(ctx.device)

    def run_hf(hf_batch_size: int):
        batch = _gpt_batch(ctx, hf_batch_size)
        # shift_labels: HF scores the same next tokens as ours (from `labels` alone it scores T - 1 of T positions)
        return ctx.time_steps(train_step(ctx, hf, lambda m, b: m(input_ids=b["input_ids"], labels=b["targets"],
                                                                    shift_labels=b["targets"]).loss, batch))

    hf_batch_size, timing = largest_batch(ctx, tuple(b for b in s.gpt_batches if b <= batch_size), run_hf)
    rows.append(row(ctx, name, "HF GPT2LMHeadModel (sdpa)", hf_batch_size, s.gpt_seq, timing,
                    flops * hf_batch_size // batch_size, **smaller_batch_note(hf_batch_size, batch_size)))
    return rows


def phase_gpt_compile(ctx: PhaseContext) -> list[dict]:
    return phase_gpt(ctx, compiled=True)


def phase_decode(ctx: PhaseContext) -> list[dict]:
    """Greedy and beam-4 decoding of one prompt, ours against HF `generate`, rounds interleaved, medians of 3."""
    from models.generation import beam_search, greedy

    prompt_len, new = ctx.sizes.decode
    ours, hf = (m.to(ctx.device).eval() for m in _gpt_models(ctx))
    if ctx.cuda:  # decoding reads every weight per token: half the bytes in bf16
        ours, hf = ours.to(torch.bfloat16), hf.to(torch.bfloat16)
    prompt = torch.randint(0, ctx.sizes.gpt_vocab, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    hf_prompt = prompt.to(ctx.device)
    out: dict[str, list[int]] = {}
    runs = {
        ("greedy", "ours"): lambda: out.__setitem__("greedy ours", greedy(ours, prompt.tolist(), new)[0]),
        ("greedy", "HF generate"): lambda: out.__setitem__("greedy HF", hf.generate(
            hf_prompt, attention_mask=torch.ones_like(hf_prompt), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, num_beams=1, pad_token_id=0)[0, prompt_len:].tolist()),
        ("beam-4", "ours"): lambda: out.__setitem__("beam-4 ours", beam_search(ours, prompt[0].tolist(), new, 4)[0]
                                                    .tokens),
        ("beam-4", "HF generate"): lambda: out.__setitem__("beam-4 HF", hf.generate(
            hf_prompt, attention_mask=torch.ones_like(hf_prompt), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, num_beams=4, early_stopping=False, pad_token_id=0)[0, prompt_len:].tolist()),
    }
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for round_ in range(4):  # the first round warms up
        for key, run in runs.items():
            ctx.sync()
            started = time.perf_counter()
            run()
            ctx.sync()
            if round_:
                times[key].append(time.perf_counter() - started)
        if round_ >= 1 and time.perf_counter() > ctx.deadline:
            break
    rows = []
    for (mode, impl), seconds in times.items():
        s = statistics.median(seconds)
        same = out[f"{mode} ours"] == out[f"{mode} HF"]
        note = f"prompt {prompt_len} tokens, {new} new; the same tokens as HF's: {same}" if impl == "ours" else None
        rows.append({"model": "GPT-small (124M)" if ctx.sizes.gpt == "gpt_small" else ctx.sizes.gpt,
                     "impl": f"{impl}, {mode}", "batch": 1, "seq": new, "dtype": "bf16" if ctx.cuda else "fp32",
                     "step_s": s, "tokens_per_s": new / s, "timed_steps": len(seconds),
                     **({"note": note} if note else {})})
    return rows


def phase_elmo(ctx: PhaseContext) -> list[dict]:
    """forward + backward of one window of both directions, state carried (bench_elmo.py's step, its FLOP count)."""
    from bench_elmo import forward_flops

    from models.elmo import N_CHARACTERS, BiLanguageModel, elmo_config

    size, vocab, B, T = ctx.sizes.elmo
    torch.manual_seed(0)
    model = BiLanguageModel(elmo_config(size, vocab_size=vocab)).to(ctx.device).train()
    c, g = model.config, torch.Generator().manual_seed(0)
    chars = torch.randint(1, N_CHARACTERS, (2, B, T, c.max_characters_per_token), generator=g).to(ctx.device)
    targets = torch.randint(0, vocab, (2, B, T), generator=g).to(ctx.device)
    state = [None]

    def step():
        with ctx.autocast():
            out = model(chars[0], chars[1], targets[0], targets[1], state=state[0])
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        state[0] = tuple([(h.detach(), c_.detach()) for h, c_ in d] for d in out.state)

    timing = ctx.time_steps(step)
    return [row(ctx, f"ELMo ({size})", "ours", B, T, timing, 3 * forward_flops(c, B, T),
                note="forward + backward, no optimizer step (bench_elmo.py)")]


def phase_skip_thought(ctx: PhaseContext) -> list[dict]:
    """encoder + both decoders + shared softmax, backward, fused AdamW (bench_skip_thought.py's FLOP count)."""
    from bench_skip_thought import forward_flops, random_batch, skip_thought_loss

    from models.skip_thought import SkipThoughts, skip_thought_config

    size, vocab, B, T = ctx.sizes.skip_thought
    torch.manual_seed(0)
    cfg = skip_thought_config(size, vocab_size=vocab)
    model = SkipThoughts(cfg).to(ctx.device)
    batch = {k: v.to(ctx.device) if k.endswith("ids") else v for k, v in random_batch(cfg, T, B).items()}
    timing = ctx.time_steps(train_step(ctx, model, skip_thought_loss, batch))
    return [row(ctx, f"Skip-Thought ({size})", "ours", B, T, timing, 3 * sum(forward_flops(cfg, T, B).values()))]


# The harness phases: the pipeline's `bert_pretrain` stage, run as the engine runs it, on data made here without Ray
# (the GPU machine has none; the data stages' own functions make it)

CORPUS_WORDS = 40_000  # distinct words of the synthetic corpus: enough for a 30,522-piece WordPiece vocabulary


def synthetic_books(rng, n_books: int, sentences_per_book: int) -> list[list[str]]:
    """Books of sentences of random made-up words with Zipf-like frequencies: text a WordPiece vocabulary of BERT's
    size can be trained on, and sentence pairs with real document boundaries for next-sentence prediction."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(CORPUS_WORDS)]
    weights = [1 / (rank + 10) for rank in range(CORPUS_WORDS)]
    return [[" ".join(rng.choices(words, weights, k=rng.randint(8, 30))) + "." for _ in range(sentences_per_book)]
            for _ in range(n_books)]


def harness_inputs(ctx: PhaseContext, cfg) -> dict[str, Path]:
    """The tokenizer and examples stages' outputs for `cfg`, made once per work directory by the same functions those
    stages call (train_wordpiece, create_training_instances, write_instances)."""
    import random

    from data_prep.corpus.tokenizer import load_tokenizer, train_wordpiece
    from data_prep.examples.bert_examples import create_training_instances, write_instances

    tokenizer_dir, examples_dir = ctx.work_dir / "bert_tokenizer", ctx.work_dir / "bert_examples"
    if (examples_dir / "done").exists():
        return {"bert_tokenizer": tokenizer_dir, "bert_examples": examples_dir}
    rng = random.Random(0)
    n_books, per_book = (8, 60) if ctx.quick else (40, 600)
    books = synthetic_books(rng, n_books, per_book)
    started = time.perf_counter()
    tok = train_wordpiece((s for b in books for s in b), tokenizer_dir, vocab_size=cfg.tokenizer.vocab_size,
                          min_frequency=1, lowercase=True)
    documents = [[enc.ids for enc in tok.encode_batch(book, add_special_tokens=False)] for book in books]
    instances = create_training_instances(documents, cfg.examples.max_seq_length, 0.0, 1, rng)
    examples_dir.mkdir(parents=True, exist_ok=True)
    write_instances(instances, examples_dir / "examples-00000.arrow", tok.token_to_id("[CLS]"),
                    tok.token_to_id("[SEP]"))
    (examples_dir / "done").touch()
    print(f"  harness data: {len(instances)} instances, vocabulary {load_tokenizer(tokenizer_dir).get_vocab_size()}"
          f", in {time.perf_counter() - started:.0f} s", flush=True)
    return {"bert_tokenizer": tokenizer_dir, "bert_examples": examples_dir}


def harness_config(ctx: PhaseContext, trainer: list[str], run_dir: Path, clock_path: Path):
    from hydra import compose, initialize_config_dir

    import pipeline.config  # noqa: F401  registers the config schema
    from pipeline import CONF_DIR

    s = ctx.sizes
    warmup, timed = s.harness_steps
    steps = warmup + timed
    overrides = [f"+experiment={s.harness_experiment}", "logger=csv", f"paths.cache_dir={ctx.work_dir / 'cache'}",
                 f"paths.run_dir={run_dir}", f"pretrain.max_steps={steps}", f"pretrain.batch_size={s.harness_batch}",
                 f"pretrain.warmup_steps={steps}", f"pretrain.val_every_steps={steps}",
                 f"++pretrain.checkpoint_every_steps={10 * steps}", f"pretrain.val_max_instances={s.harness_batch}",
                 "pretrain.val_fraction=0.05", "pretrain.encoder_snapshots=[]", "examples.max_seq_length=128",
                 # harness_inputs makes the tokenizer and examples stages' outputs, not piece_vectors'
                 "pretrain.init_embeddings=random", "pretrain.freeze_embeddings=none",
                 "+callbacks.step_clock._target_=gpu_phases.StepClock",
                 f"+callbacks.step_clock.warmup_steps={warmup}", f"+callbacks.step_clock.path={clock_path}",
                 *trainer]
    if ctx.quick:
        overrides += ["tokenizer.vocab_size=300", "examples.max_seq_length=32"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


class StepClock(L.Callback):
    """The wall time from the end of step `warmup_steps` to the end of the last step, the device synchronised at both
    ends only (the harness's own synchronisations, if any, stay what they are), written to `path` as JSON. Its
    on_train_batch_end runs before ModelCheckpoint's (Lightning puts checkpointing last) and the last validation."""

    def __init__(self, warmup_steps: int, path: str):
        self.warmup_steps, self.path = warmup_steps, Path(path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step not in (self.warmup_steps, trainer.max_steps):
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if step == self.warmup_steps:
            self.started = time.perf_counter()
        else:
            self.path.write_text(json.dumps({"steps": step - self.warmup_steps,
                                             "seconds": time.perf_counter() - self.started}))


def run_harness(ctx: PhaseContext, trainer: list[str], label: str) -> list[dict]:
    """The bert_pretrain stage's function under `trainer` (the harness: Trainer, callbacks, checkpoints, validation,
    outputs), called as the engine calls it, and its steady-state step time."""
    from pipeline.engine.dag import StageContext, plain_config
    from pipeline.stages import STAGES

    run_dir = Path(tempfile.mkdtemp(dir=ctx.work_dir, prefix=re.sub(r"\W", "_", label)))
    clock = run_dir / "step_clock.json"
    cfg = harness_config(ctx, trainer, run_dir, clock)
    inputs = harness_inputs(ctx, cfg)
    s = ctx.sizes
    seq = cfg.examples.max_seq_length
    out_dir = run_dir / "bert_pretrain"
    out_dir.mkdir()
    summary = STAGES["bert_pretrain"].fn(StageContext(plain_config(cfg), "bert_pretrain", out_dir, inputs))
    measured = json.loads(clock.read_text())
    step_s = measured["seconds"] / measured["steps"]
    timing = {"step_s": step_s, "timed_steps": measured["steps"], "first_step_s": None}
    rows = [row(ctx, "BERT-base" if s.harness_experiment == "bert_base" else s.harness_experiment,
                f"pipeline bert_pretrain stage, {label}", s.harness_batch, seq, timing, None,
                note=f"stage summary: {summary['steps']} steps, precision {summary['precision']}, "
                     f"{summary['seconds']} s with start-up and validation")]
    return rows


def bare_step(ctx: PhaseContext, cfg_trainer: list[str]) -> dict:
    """The harness's work without the harness: the stage's own module (task.build_module), one batch of its own
    loader on the device, its optimizer and schedule, gradient clipping, bf16 autocast."""
    from models import IGNORE_INDEX
    from pipeline.bert.pretrain import PRETRAINING
    from pipeline.engine.dag import StageContext, plain_config
    from pipeline.engine.pretraining_task import built_module

    run_dir = Path(tempfile.mkdtemp(dir=ctx.work_dir, prefix="bare"))
    cfg = harness_config(ctx, cfg_trainer, run_dir, run_dir / "unused.json")
    inputs = harness_inputs(ctx, cfg)
    stage_ctx = StageContext(plain_config(cfg), "bert_pretrain", run_dir, inputs)
    task = PRETRAINING["bert_pretrain"]
    settings = task.settings(stage_ctx.cfg)
    module = built_module(task, stage_ctx, settings).to(ctx.device).train()  # with the run's kernels
    data = task.data(stage_ctx, module, settings, 0, 1)
    batch = {k: v.to(ctx.device) for k, v in next(iter(data.train_loader)).items()}
    optimization = module.configure_optimizers()
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    clip = cfg.pretrain.grad_clip

    def step():
        with ctx.autocast():
            loss = module.model_step(batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    warmup, timed = ctx.sizes.harness_steps
    ctx.reset_memory()
    c = module.model.config
    B, T = batch["input_ids"].shape
    masked = int((batch["mlm_labels"] != IGNORE_INDEX).sum())
    return {**ctx.time_steps(step, warmup, timed),
            "flops_per_step": bert_step_flops(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size,
                                              B, T, masked)}


def phase_harness(ctx: PhaseContext) -> list[dict]:
    trainer = ["trainer=gpu", "trainer.precision=bf16-mixed"] if ctx.cuda else ["trainer=cpu"]
    bare = bare_step(ctx, trainer)
    ctx.reset_memory()
    s = ctx.sizes
    flops = bare.pop("flops_per_step")  # of the batch the bare step repeats: the stage's batches are alike
    rows = run_harness(ctx, trainer, "trainer=gpu" if ctx.cuda else "trainer=cpu")
    name, seq = rows[0]["model"], rows[0]["seq"]
    rows.insert(0, row(ctx, name, "bare step of the stage's module", s.harness_batch, seq, bare, flops))
    rows[1]["flops_per_step"] = flops
    rows[1]["overhead_vs_bare"] = rows[1]["step_s"] / bare["step_s"] - 1
    return rows


def phase_harness_deepspeed(ctx: PhaseContext) -> list[dict]:
    if not ctx.cuda:
        raise SkipPhase("DeepSpeed on a CPU trains in Ray Train workers by deepspeed.initialize, without a Lightning "
                        "Trainer to run the step clock (pipeline/engine/deepspeed_loop.py); on a GPU this phase runs "
                        "Lightning's DeepSpeedStrategy in its own process")
    trainer = ["trainer=deepspeed", "trainer.accelerator=gpu", "distributed.num_workers=1",
               "trainer.precision=bf16-mixed"]
    return run_harness(ctx, trainer, "trainer=deepspeed")


class SkipPhase(Exception):
    """A phase that cannot run on this device: its message is the reason printed."""


PHASES = {"peak": phase_peak, "bert": phase_bert, "gpt": phase_gpt, "harness": phase_harness, "decode": phase_decode,
          "bert_compile": phase_bert_compile, "gpt_compile": phase_gpt_compile,
          "harness_deepspeed": phase_harness_deepspeed, "elmo": phase_elmo, "skip_thought": phase_skip_thought}
