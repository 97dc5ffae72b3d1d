"""The evaluate stage: SentEval-style probes of frozen sentence embeddings (Conneau & Kiela 2018; seed 000), one
row per encoder and task, comparing the families' encoders (pipeline/families.py) with the bag-of-GloVe baseline of
the seed."""
from __future__ import annotations

from omegaconf import DictConfig

from data_prep.corpus.shards import write_json_atomically
from data_prep.corpus.word_vectors import load_glove
from pipeline.engine.dag import Stage, StageContext
from pipeline.engine.family import EncoderSpec
from pipeline.engine.settings import all_cpus, cache_dir_of, typed_settings
from pipeline.evaluation.embedding import GloveBagOfWords
from pipeline.evaluation.senteval import SentevalConfig, run_senteval, senteval_files_fingerprint, tasks_with_data
from pipeline.evaluation.settings import EvaluateConfig
from pipeline.families import FAMILIES

# evaluate.encoders name -> its spec. Each family's `*_random` is its architecture freshly initialised and frozen:
# random encoders are strong probing baselines (Wieting & Kiela 2019), so a pretrained encoder has learned something
# only where it beats its twin.
ENCODERS: dict[str, EncoderSpec] = {
    "glove_bow": EncoderSpec(lambda cfg: (), lambda ctx: GloveBagOfWords(load_glove())),
    **{name: spec for family in FAMILIES for name, spec in family.encoders.items()},
}




def evaluate_upstream(cfg: DictConfig) -> tuple[str, ...]:
    """The stages of the encoders `evaluate.encoders` names."""
    names = typed_settings(cfg.evaluate, EvaluateConfig).encoders
    return tuple(sorted({stage for name in names for stage in ENCODERS[name].upstream(cfg)}))


def evaluate(ctx: StageContext) -> dict:
    """results.json, and in the stage's summary the tasks skipped for want of data (name -> the path looked for),
    which the report names above the table."""
    senteval, tasks_without_data = tasks_with_data(typed_settings(ctx.cfg.senteval, SentevalConfig),
                                                   "so the evaluate stage skips it")
    encoders = [ENCODERS[name].build(ctx) for name in typed_settings(ctx.cfg.evaluate, EvaluateConfig).encoders]
    rows = [{"model": row.pop("encoder"), **row, "std": 0.0, "seeds": 1}
            for row in run_senteval(encoders, senteval, ctx.cfg.seed)]
    write_json_atomically(ctx.out_dir / "results.json", rows)
    return {"results": rows, "tasks_without_data": tasks_without_data}


# trainer.fast_kernels: the encoders run with models/kernels.py's modules where it is on (the same vectors to float
# rounding), a key of the stage as of every other stage that reads it
EVALUATE = Stage("evaluate", evaluate, evaluate_upstream, ("evaluate", "senteval", "seed", "trainer.fast_kernels"),
                 fingerprint=lambda cfg: senteval_files_fingerprint(typed_settings(cfg.senteval, SentevalConfig),
                                                                    cache_dir_of(cfg)),
                 num_cpus=all_cpus)
