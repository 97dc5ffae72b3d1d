"""Loads exported HuggingFace directories as a user of them does, on a machine without this project: run by
tests/run/test_hf_export.py as `python -I tests/hf_fresh_process.py REPO CASES OUT` from an empty directory, so that
neither the working directory nor PYTHONPATH puts the repository on sys.path, and with any import of the project's
packages refused (the editable install would find them otherwise). Each case (a JSON list in CASES) names a directory,
the Auto classes to load it with, and texts for its tokenizer or token ids to feed; what the models and tokenizers give
is saved with torch.save into OUT for the test to compare with the pipeline's own models."""
import importlib.abc
import json
import sys

REPO, CASES, OUT = sys.argv[1:4]
PROJECT = ("models", "pipeline", "data_prep", "conventions", "tests", "hydra_plugins", "benchmarks")


class RefuseTheProject(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in PROJECT:
            raise ImportError(f"{name} was imported: an exported directory must work without this project")


sys.meta_path.insert(0, RefuseTheProject())

import torch  # noqa: E402
import transformers  # noqa: E402

SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def tokenizer_facts(tokenizer, texts: list[str]) -> dict:
    return {"ids": [tokenizer(text)["input_ids"] for text in texts], "model_max_length": tokenizer.model_max_length,
            "special": {name: getattr(tokenizer, name) for name in SPECIAL},
            "class": type(tokenizer).__name__}


def run(case: dict) -> dict:
    path, out = case["dir"], {}
    models = {auto: getattr(transformers, auto).from_pretrained(path, trust_remote_code=True).eval()
              for auto in case["auto"]}
    out["classes"] = {auto: type(model).__name__ for auto, model in models.items()}
    if case.get("texts"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        out["tokenizer"] = tokenizer_facts(tokenizer, case["texts"])
        if tokenizer.pad_token is not None:  # GPT-2's has none: its texts are fed one at a time
            batch = tokenizer(case["texts"], padding=True, truncation=True, return_tensors="pt")
            out["batch"] = dict(batch)
            out["word_ids"] = [batch.word_ids(i) for i in range(len(case["texts"]))]
    if case.get("inputs"):
        out["batch"] = torch.load(case["inputs"])
    with torch.no_grad():
        for auto, model in models.items():
            if auto == "AutoModelForCausalLM":
                limit = model.config.n_positions
                out[auto] = [model(input_ids=torch.tensor([ids[:limit]])).logits[0]
                             for ids in out["tokenizer"]["ids"]]
                prompt = torch.tensor([out["tokenizer"]["ids"][0][:4]])
                out["generated"] = model.generate(prompt, max_new_tokens=8, do_sample=False)[0].tolist()
                continue
            outputs = model(**out["batch"])
            out[auto] = {k: v for k, v in outputs.items() if v is not None}
            if auto == "AutoModelForSeq2SeqLM":  # what it writes from each source, greedily
                out["generated"] = [model.generate(input_ids=ids[mask.bool()][None], max_new_tokens=8,
                                                   do_sample=False)[0].tolist()
                                    for ids, mask in zip(out["batch"]["input_ids"], out["batch"]["attention_mask"])]
            if hasattr(model, "words"):  # ELMo: the tokens gathered back into the character ids of words
                out["words"] = model.words(out["batch"]["input_ids"], out["batch"]["attention_mask"])
    return out


def in_project(path: str) -> bool:
    """The repository's root or one of its packages (its .venv, where torch lives, is neither)."""
    path = path.rstrip("/")
    return path == REPO or any(path == f"{REPO}/{package}" or path.startswith(f"{REPO}/{package}/")
                               for package in PROJECT)


results = {case["dir"]: run(case) for case in json.loads(open(CASES).read())}
leaked = sorted(name for name, module in list(sys.modules.items())
                if in_project(getattr(module, "__file__", "") or "") and module.__file__ != __file__)
assert not leaked, f"modules of the repository were loaded: {leaked}"
assert not any(in_project(entry) for entry in sys.path), sys.path
results["_custom_code_modules"] = sorted(name for name in sys.modules if name.startswith("transformers_modules"))
torch.save(results, OUT)
