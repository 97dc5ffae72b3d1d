"""`python -m pipeline.export RUN_DIR --to DIR`: a run's final models as HuggingFace directories, one subfolder of DIR
per model with its model card (README.md), ready for `huggingface-cli upload`.

A run's final models are the last pretraining stage of each family it trained (BERT's phase 2 where the run has one;
both of Skip-Thought's encoders where it trains both, as `skip_thought` and `skip_thought_bi`). Each stage wrote its
model as transformers loads it (`hf/`: weights, config, tokenizer, and our modelling code where transformers has no
class for the model: models/hf/); that directory is copied, and the card is written from what the run directory
holds: the model's config, described by its family (Family.describe_export), the stage's summary (steps, tokens,
held-out loss against its baselines), the prepared corpus's manifest (its size, what decontamination removed) and
provenance, the run's fine-tuning and probing results next to the random twin's, and the command (Hydra's
`.hydra/overrides.yaml`) that ran it. A stage's own `hf/` is shared
by every run that reuses it, so only an export knows the run's downstream results.

Each model is copied into a hidden staging folder of DIR, checked file by file against the sha256 its stage recorded
when it finished (the check of `python -m pipeline.status --verify`), and only then renamed to its name: a model whose
code, weights or vocabulary changed since, or a copy cut short (a full disk, a kill), is never left under its name.

Exit status 2, with a one-line error, for a directory that is no finished run or holds no model to export, a model
whose files are not what its stage wrote, or a --to that cannot take the export; 130 for Ctrl-C.

One file of ~450 lines: one command, whose parts (finding the models, the verified staged copy, the model card) all
read the same run directory.
"""
from __future__ import annotations

import argparse
import errno
import json
import math
import os
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from safetensors import safe_open

from data_prep.corpus.shards import MANIFEST_NAME
from pipeline.data_settings import DataConfig
from pipeline.downstream.finetune import BASELINES, MODEL_KINDS, is_snapshot
from pipeline.engine.dag import read_marker, resolve_upstream
from pipeline.engine.integrity import OUTPUTS_KEY, damage_message, damaged_outputs, output_files
from pipeline.engine.settings import stages_in_run, typed_settings
from pipeline.evaluation.stage import ENCODERS
from pipeline.families import FAMILIES
from pipeline.report.report import corpus_lines, learning_lines, probes_not_run, probes_without_data
from pipeline.stages import STAGES
from pipeline.status import FINISHED, StageStatus, human_bytes, read_status

HF_DIR = "hf"  # what every family's pretraining stage writes its model into
CARD = "README.md"
FAMILY = {family.name: family for family in FAMILIES}
# The task an Auto class serves, as the Hub's pipeline_tag names it
PIPELINE_TAGS = {"AutoModelForMaskedLM": "fill-mask", "AutoModelForCausalLM": "text-generation",
                 "AutoModelForSeq2SeqLM": "text2text-generation", "AutoModel": "feature-extraction"}
# What the Hub's metadata can say of the built-in corpora (data.corpus): their language and the Hub's copy of the data
BUILTIN_CORPUS_METADATA = {"imdb_reviews": {"language": ["en"], "datasets": ["stanfordnlp/imdb"]},
                           "books_builtin": {"language": ["en"]}}


class ExportError(Exception):
    pass


@dataclass(frozen=True)
class FinalModel:
    name: str    # its subfolder of the export
    family: str
    stage: str
    output: Path  # the stage's output directory


def run_config(run_dir: Path) -> DictConfig:
    """The config the run composed, as Hydra saved it in the run directory."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise ExportError(f"{path} not found: {run_dir} is not a directory `python -m pipeline` ran in (Hydra writes "
                          "the run's config there); pass the directory it printed as 'run directory:'")
    rerun = "rerun the run's command (finished stages are reused) and export the run directory it prints"
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as err:
        raise ExportError(f"{path} cannot be read as YAML ({' '.join(str(err).split())}); {rerun}") from None
    if not isinstance(cfg, DictConfig) or "pipeline" not in cfg:
        raise ExportError(f"{path} is not a run's config (it has no pipeline settings); {rerun}")
    return cfg


def run_status(run_dir: Path) -> list[StageStatus]:
    try:
        return read_status(run_dir)
    except (FileNotFoundError, ValueError) as err:
        raise ExportError(str(err)) from None


def final_models(statuses: list[StageStatus], cfg: DictConfig) -> list[FinalModel]:
    """The last finished pretraining stage of each family in the run (`statuses`, its stages): the ones no other of
    its pretraining stages in the run continues from."""
    # One gone would make an earlier stage look final (BERT's phase 1 for its deleted phase 2)
    pretraining = {stage for family in FAMILIES for stage in family.pretraining_stages}
    for s in statuses:
        if s.state == "deleted" and s.name in pretraining:
            raise ExportError(f"the output of stage {s.name} ({s.output}) is gone from the cache since the run "
                              f"finished it; rerun the run's command to make it again (finished stages are reused), "
                              "then export")
    finished = {s.name: s.output for s in statuses if s.state in FINISHED}
    graph = resolve_upstream(STAGES, cfg)
    models = []
    for family in FAMILIES:
        trained = [stage for stage in family.pretraining_stages if stage in finished]
        final = [stage for stage in trained if not any(stage in graph[other].upstream for other in trained)]
        for stage in final:
            name = family.name if len(final) == 1 else stage.removesuffix("_pretrain")
            models.append(FinalModel(name, family.name, stage, finished[stage]))
    return models


# Between a model's name and the process that stages it: `.bert.partial.1234@host`
STAGING_MARK = ".partial."


def exists_message(target: Path) -> str:
    return f"{target} exists; remove it, export elsewhere, or pass --overwrite"


def export(run_dir: Path, to: Path, overwrite: bool = False) -> list[Path]:
    """Copy each final model's hf/ into `to`/<name> with its card; returns the directories written. Every model is
    staged and verified before any is put in place, so a refusal or failure leaves `to` as it was."""
    cfg = run_config(run_dir)
    statuses = run_status(run_dir)
    models = final_models(statuses, cfg)
    if not models:
        raise ExportError(f"{run_dir} has no finished pretraining stage to export (python -m pipeline.status "
                          f"{run_dir} shows what ran)")
    if to.exists() and not to.is_dir():
        raise ExportError(f"--to={to} is a file; pass a directory to write one subfolder per model into")
    for s in statuses:  # a file added to a stage's output fails every later run that reuses it
        if to.resolve().is_relative_to(s.output.resolve()):
            raise ExportError(f"--to={to} is inside the output of stage {s.name} ({s.output}), which must stay as the "
                              "stage wrote it; pass a --to outside the cache")
    recorded = {}
    for model in models:
        if FAMILY[model.family].describe_export is None:
            raise ExportError(f"{run_dir} trained {model.family} ({model.stage}), whose models cannot be exported: "
                              f"{FAMILY[model.family].not_exportable}")
        if not (model.output / HF_DIR / "config.json").is_file():
            raise ExportError(f"stage {model.stage} of {run_dir} has no {HF_DIR}/ (it ran before stages wrote one); "
                              f"rerun the run's command with pipeline.force=[{model.stage}] to write it")
        if (to / model.name).exists() and not overwrite:
            raise ExportError(exists_message(to / model.name))
        recorded[model.name] = recorded_model_files(model)
    made_to = not to.exists()
    staged: dict[Path, Path] = {}  # staging folder -> the model's folder
    try:
        to.mkdir(parents=True, exist_ok=True)
        remove_abandoned_staging(to)
        for model in models:
            staging = to / f".{model.name}{STAGING_MARK}{os.getpid()}@{socket.gethostname()}"
            staged[staging] = to / model.name
            copy_verified(model, recorded[model.name], staging)
            (staging / CARD).write_text(model_card(run_dir, cfg, model, staging, to / model.name))
        for staging, target in staged.items():
            if target.exists():
                if not overwrite:  # another export put it there while this one copied
                    raise ExportError(exists_message(target))
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
            staging.rename(target)
    except OSError as err:
        raise ExportError(write_failure(err, to, models)) from None
    finally:
        for staging in staged:
            shutil.rmtree(staging, ignore_errors=True)
        if made_to and to.is_dir() and not any(to.iterdir()):
            to.rmdir()
    return list(staged.values())


def remove_abandoned_staging(to: Path) -> None:
    """Remove what an export killed mid-copy staged in `to` (it never reaches the model's name): the staging folders
    of this host's processes that are gone. Another host's are left alone, as its processes cannot be seen."""
    for staging in to.glob(f".*{STAGING_MARK}*@*"):
        pid, _, host = staging.name.rsplit(STAGING_MARK, 1)[1].partition("@")
        if host != socket.gethostname() or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(staging, ignore_errors=True)
        except PermissionError:  # another user's process runs under that pid
            pass


def recorded_model_files(model: FinalModel) -> dict[str, dict]:
    """The files of the model's hf/ as its stage recorded them when it finished (relative to hf/)."""
    marker = read_marker(model.output) or {}
    if OUTPUTS_KEY not in marker:
        raise ExportError(f"stage {model.stage}'s completion marker in {model.output} records no files to check the "
                          f"export against (it was written by an older version of the pipeline); rerun the run's "
                          f"command with pipeline.force=[{model.stage}] to write it again")
    prefix = f"{HF_DIR}/"
    return {name.removeprefix(prefix): entry for name, entry in marker[OUTPUTS_KEY].items() if name.startswith(prefix)}


def copy_verified(model: FinalModel, recorded: dict[str, dict], staging: Path) -> None:
    """Copy the model's hf/ into `staging`, then hash the copy against what the stage recorded: code that the card
    tells users to run with trust_remote_code=True must be the code the stage wrote."""
    source = model.output / HF_DIR
    for name in output_files(source, ()):
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, staging / name)
    problems = damaged_outputs(staging, recorded, (), full=True)
    if problems:
        raise ExportError(f"nothing was exported: {damage_message(model.stage, source.resolve(), problems)}")


def write_failure(err: OSError, to: Path, models: list[FinalModel]) -> str:
    """One line on why the export could not be written, naming the volume when it is full."""
    if err.errno == errno.ENOSPC:
        needed = sum(f.stat().st_size for model in models for f in (model.output / HF_DIR).rglob("*") if f.is_file())
        return (f"no space left on device writing the export to --to={to}: the volume holding it has "
                f"{human_bytes(shutil.disk_usage(to).free)} free and the models need {human_bytes(needed)}; free "
                "space there or pass a --to on another volume; nothing was exported")
    return f"could not write the export to --to={to}: {err}; pass a --to you can write to; nothing was exported"


# ------------------------------------------------------------------------------------------------------------------
# The model card (https://huggingface.co/docs/hub/model-cards): YAML metadata, then markdown


def _read_json(path: Path) -> dict | list | None:
    return json.loads(path.read_text()) if path.is_file() else None


def auto_class(config: dict) -> str:
    """The Auto class that loads the model with the head it was trained with."""
    architectures = config.get("architectures", [])
    if any(a.endswith("ForMaskedLM") for a in architectures):
        return "AutoModelForMaskedLM"
    if any(a.endswith(("LMHeadModel", "ForCausalLM")) for a in architectures):
        return "AutoModelForCausalLM"
    if any(a.endswith("ForConditionalGeneration") for a in architectures):
        return "AutoModelForSeq2SeqLM"
    return "AutoModel"


def parameter_count(hf_dir: Path) -> int:
    with safe_open(str(hf_dir / "model.safetensors"), "pt") as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())


def model_card(run_dir: Path, cfg: DictConfig, model: FinalModel, hf_dir: Path, location: Path) -> str:
    """The card of the model whose files are in `hf_dir`, to be loaded from `location`."""
    config = json.loads((hf_dir / "config.json").read_text())
    summary = _read_json(model.output / "stage.json") or {}
    custom_code = "auto_map" in config
    auto = auto_class(config)
    data = typed_settings(cfg.data, DataConfig)
    builtin = None if data.corpus_dir else str(data.corpus)
    metadata = {**BUILTIN_CORPUS_METADATA.get(builtin, {}), "license": "other", "library_name": "transformers",
                "pipeline_tag": PIPELINE_TAGS[auto],
                "tags": ["textrep", model.family, config["model_type"], *(["custom_code"] if custom_code else [])]}
    trust = ", trust_remote_code=True" if custom_code else ""
    lines = ["---", yaml.safe_dump(metadata, sort_keys=False).strip(), "---", "",
             f"# {cfg.experiment_name}: {model.name}", "",
             f"{FAMILY[model.family].describe_export(config)}", "",
             f"Pretrained by textrep's `{model.stage}` stage in a run of its `{cfg.experiment_name}` experiment: "
             f"{_parameters(parameter_count(hf_dir), summary.get('num_parameters'))}.", "",
             "## How to load it", "", "```python",
             f"from transformers import {auto}, AutoTokenizer", "",
             f'tokenizer = AutoTokenizer.from_pretrained("{location}"{trust})',
             f'model = {auto}.from_pretrained("{location}"{trust})', "```", ""]
    if custom_code:
        code = next(iter(config["auto_map"].values())).split(".")[0]
        lines += [f"transformers has no class for this model: its code is `{code}.py` in this directory (torch and "
                  "transformers only), which `trust_remote_code=True` lets transformers run.", ""]
    lines += _tokenizer_lines(hf_dir)
    lines += _data_lines(run_dir, data)
    lines += _pretraining_lines(summary)
    lines += _downstream_lines(run_dir, cfg, model.stage)
    lines += _command_lines(run_dir)
    lines += _license_lines(run_dir, data)
    return "\n".join(lines) + "\n"


def _parameters(here: int, trained: int | None) -> str:
    if trained is None or trained == here:
        return f"{here:,} parameters"
    return (f"{here:,} parameters, of the {trained:,} it trained (the rest served the pretraining objective alone: "
            "an output softmax, decoders)")


def _tokenizer_lines(hf_dir: Path) -> list[str]:
    config = _read_json(hf_dir / "tokenizer_config.json") or {}
    vocab = len(json.loads((hf_dir / "tokenizer.json").read_text())["model"]["vocab"])
    length = config.get("model_max_length")
    special = ", ".join(f"{k.removesuffix('_token')} `{v}`" for k, v in config.items() if k.endswith("_token"))
    return ["## Tokenizer", "",
            f"{vocab:,} entries ({config.get('tokenizer_class', 'tokenizer.json')}); "
            + (f"the model was trained on inputs of at most {length} tokens (model_max_length); " if length else
               "the model has no longest input; ") + f"special tokens: {special or 'none'}.", ""]


def _data_lines(run_dir: Path, data: DataConfig) -> list[str]:
    manifest = _read_json(run_dir / "prepare" / MANIFEST_NAME)
    name = f"The built-in corpus `{data.corpus}`" if not data.corpus_dir else \
        f"The books in `{data.corpus_dir}` (data.corpus_dir)"
    lines = ["## Training data", ""]
    if manifest is None:
        return lines + [f"{name}; its prepared manifest is not in the run directory.", ""]
    return lines + corpus_lines(manifest, name)


def _pretraining_lines(summary: dict) -> list[str]:
    lines = ["## Pretraining", ""]
    tokens = f"{summary['tokens_seen']:,} tokens seen" if summary.get("tokens_seen") is not None else \
        "tokens seen not recorded"
    lines.append(f"- {summary.get('steps')} steps, {tokens}, {summary.get('seconds')} s of training on "
                 f"{summary.get('workers')} worker(s), precision {summary.get('precision')}")
    learned = learning_lines(summary)
    if learned:
        lines += learned
    elif summary.get("final_val_loss") is not None:
        uniform = summary.get("uniform_val_loss")
        lines.append(f"- held-out loss {summary['final_val_loss']:.4f}"
                     + (f" against {uniform:.4f} for a uniform guess over the outputs" if uniform else ""))
    if summary.get("heldout_perplexity") is not None:
        perplexity = summary["heldout_perplexity"]
        shown = ", ".join(f"{k} {v:.1f}" for k, v in perplexity.items()) if isinstance(perplexity, dict) else \
            f"{perplexity:.1f}"
        lines.append(f"- held-out perplexity: {shown}")
    return lines + [""]


def _pretraining_stages_read(upstream: tuple[str, ...]) -> set[str]:
    every = {stage for family in FAMILIES for stage in family.pretraining_stages}
    return set(upstream) & every


def _cell(row: dict | None) -> str:
    if row is None:
        return "–"
    spread = f" ± {row['std']:.4f}" if row.get("seeds", 1) > 1 else ""
    return f"{row['score']:.4f}{spread}"


def _baseline_cell(name: str, same_size: dict | None, all_labels: dict) -> str:
    if same_size is not None:
        return f"{name} {same_size['score']:.4f}"
    return f"{name} {all_labels['score']:.4f} (on all {all_labels['train_examples']:,})"


def _downstream_lines(run_dir: Path, cfg: DictConfig, stage: str) -> list[str]:
    """This model's fine-tuning and probing rows next to its random twin's (the same architecture, randomly
    initialised: what pretraining gave) and the baselines fitted on the same examples."""
    lines = ["## Downstream results of this run", ""]
    finetune = _read_json(run_dir / "finetune" / "results.json") if "finetune" in stages_in_run(cfg) else None
    if finetune:
        kinds = [name for name, kind in MODEL_KINDS.items()
                 if kind.random_twin and _pretraining_stages_read(kind.upstream(cfg)) == {stage}]
        rows = [r for r in finetune if not is_snapshot(r)]
        index = {(r["model"], r["task"], r["metric"], r.get("train_examples")): r for r in rows}
        # a baseline fitted once on all the labels (majority_class) stands beside every size
        on_all = {(r["model"], r["task"], r["metric"]): r for r in rows if r.get("train_size") is None}
        table = []
        for row in (r for r in rows if r["model"] in kinds):
            key = (row["task"], row["metric"], row.get("train_examples"))
            twin = index.get((MODEL_KINDS[row["model"]].random_twin, *key))
            difference = "–" if twin is None else f"{row['score'] - twin['score']:+.4f}"
            seeds = zip(row.get("per_seed") or [], (twin or {}).get("per_seed") or [])
            pairs = [(a, b) for a, b in seeds if a is not None and b is not None]
            ahead = f"{sum(a > b for a, b in pairs)} of {len(pairs)}" if pairs else "–"
            baselines = ", ".join(_baseline_cell(b, index.get((b, *key)), on_all.get((b, *key[:2]))) for b in BASELINES
                                  if (b, *key) in index or (b, *key[:2]) in on_all)
            table.append(f"| {row['task']} | {row['metric']} | {row.get('train_examples', '–')} | {row['model']} "
                         f"{_cell(row)} | {_cell(twin)} | {difference} | {ahead} | {baselines or '–'} |")
        if table:
            scored = "the held-out part of train" if any(r.get("scored_on") == "train_holdout" for r in rows) else \
                "the dev set"
            lines += [f"Fine-tuned end to end (mean ± std over seeds, scored on {scored}), beside the same "
                      "architecture fine-tuned from random initialisation:", "",
                      "| task | metric | train examples | this model | random twin | difference | seeds ahead | "
                      "baselines |", "|---|---|---|---|---|---|---|---|", *table, ""]
    evaluate = _read_json(run_dir / "evaluate" / "results.json") if "evaluate" in stages_in_run(cfg) else None
    if evaluate:
        encoders = [name for name, spec in ENCODERS.items()
                    if spec.random_twin and _pretraining_stages_read(spec.upstream(cfg)) == {stage}]
        index = {(r["model"], r["task"], r["metric"]): r for r in evaluate}
        table = []
        for row in (r for r in evaluate if r["model"] in encoders):
            twin = index.get((ENCODERS[row["model"]].random_twin, row["task"], row["metric"]))
            difference = "–" if twin is None else f"{row['score'] - twin['score']:+.4f}"
            table.append(f"| {row['task']} | {row['metric']} | {row['model']} {row['score']:.4f} | {_cell(twin)} | "
                         f"{difference} |")
        if table:
            lines += ["Frozen, probed as SentEval does, beside the same architecture randomly initialised and frozen:",
                      "", "| task | metric | this model | random twin | difference |", "|---|---|---|---|---|",
                      *table, "", *probes_not_run(probes_without_data(run_dir / "evaluate"))]
    if len(lines) == 2:
        lines += ["The run fine-tuned and probed nothing with this model.", ""]
    return lines


def _command_lines(run_dir: Path) -> list[str]:
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else None
    if overrides is None:
        return ["## Reproduce", "", f"The run's command is not recorded ({overrides_file} is missing).", ""]
    command = " ".join(["python -m pipeline", *(shlex.quote(o) for o in overrides)])
    return ["## Reproduce", "", "With textrep (its `make install`), from the repository's root:", "", "```bash",
            command, "```", ""]


def _license_lines(run_dir: Path, data: DataConfig) -> list[str]:
    lines = ["## License", ""]
    manifest = _read_json(run_dir / "prepare" / MANIFEST_NAME) or {}
    provenance = Path(manifest.get("corpus_dir", "")) / "PROVENANCE.md"
    if manifest.get("corpus_dir") and provenance.is_file():
        quoted = [f"> {line}" if line else ">" for line in provenance.read_text().strip().splitlines()]
        return lines + ["The weights are derived from the training data, whose terms they follow. Its provenance, as "
                        "textrep recorded it when it fetched the data:", "", *quoted, ""]
    return lines + [f"The training data ({data.corpus_dir or data.corpus}) came from outside textrep, which "
                    "does not know its license: the weights are derived from it and follow its terms. State them "
                    "here, and in the `license` field above, before you publish the model.", ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.export", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (outputs/<experiment>/<date_time>)")
    parser.add_argument("--to", type=Path, required=True, help="the directory to write one subfolder per model into")
    parser.add_argument("--overwrite", action="store_true", help="replace subfolders of --to that exist")
    args = parser.parse_args(argv)
    try:
        written = export(args.run_dir, args.to, args.overwrite)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # what it had staged is removed on the way out
        print("interrupted; nothing was exported; rerun the same command", file=sys.stderr)
        return 130
    for path in written:
        config = json.loads((path / "config.json").read_text())
        print(f"{path}: {config['architectures'][0]}" + (" (trust_remote_code=True)" if "auto_map" in config else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
