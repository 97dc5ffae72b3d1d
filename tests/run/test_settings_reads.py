"""Settings are read through their block's typed object (pipeline/engine/settings.py typed_settings), made where a
stage, a hook or a start-up check begins, not by string key below it: `cfg.<block>.<key>` appears in the code only
where this file lists it, with the reason."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from pipeline.config import ENGINE_BLOCKS
from pipeline.families import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = sorted({*ENGINE_BLOCKS, *(name for family in FAMILIES for name in family.config), "pretrain_phase2"})
# `cfg.gpt.block_size`, `ctx.cfg.pretrain.init_from`; `typed_settings(cfg.gpt.pretrain, ...)` makes a typed object
_READ = re.compile(rf"(?<!typed_settings\()\b(?:ctx\.cfg|cfg|config)\.(?:{'|'.join(BLOCKS)})\.[a-z_]+\b"
                   r"(?!\s*,\s*[A-Z])")

ALLOWED = Counter({
    # the `model` and `logger` blocks are open: their `_target_` class decides their keys, so they are instantiated
    # or looked into as they are
    ("pipeline/engine/tracking.py", "cfg.logger._target_"): 1,
    ("pipeline/runner.py", "cfg.logger.get"): 1,
    ("pipeline/bert/data_stages.py", "cfg.model.config"): 1,  # the width of the piece vectors
    ("pipeline/seq2seq/data_stages.py", "cfg.model.config"): 1,  # the width of the piece vectors
    ("pipeline/bert/pretrain.py", "cfg.model.config"): 2,  # the position table; the control's scratch encoder
    ("pipeline/bert/pretrain.py", "cfg.model._target_"): 1,
    ("pipeline/bert/pretrain.py", "cfg.model.generator_layers"): 1,
    ("pipeline/skip_thought/family.py", "cfg.model.config"): 1,
    # the one accessor of paths.cache_dir (cache_dir_of: paths.run_dir needs Hydra's runtime to resolve) and of
    # pipeline.stages outside planning (stages_in_run: a config made for one stage need not plan a run)
    ("pipeline/engine/settings.py", "cfg.paths.cache_dir"): 1,
    ("pipeline/engine/settings.py", "cfg.pipeline.stages"): 1,
})


def _reads() -> Counter:
    found = Counter()
    for folder in ("pipeline", "models", "data_prep"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for match in _READ.finditer(path.read_text()):
                found[(str(path.relative_to(ROOT)), match.group(0))] += 1
    return found


def test_the_pattern_finds_a_string_keyed_read_and_passes_a_typed_conversion():
    assert _READ.findall("x = ctx.cfg.gpt.block_size + cfg.pretrain.lr") == ["ctx.cfg.gpt.block_size",
                                                                               "cfg.pretrain.lr"]
    assert _READ.findall("own = typed_settings(cfg.gpt.pretrain, GptPretrainConfig)") == []


def test_settings_are_read_through_typed_objects_except_where_listed():
    found = _reads()
    new = {key: n for key, n in found.items() if n > ALLOWED[key]}
    assert not new, (f"string-keyed settings reads {new}: read the block once as its typed settings "
                     "(typed_settings(cfg.<block>, Schema)) where the stage or hook begins, and pass the values on")
    assert found == ALLOWED, f"listed here but gone from the code (drop them from ALLOWED): {ALLOWED - found}"


# `f = ctx.cfg.finetune`, then `f.lr`: a string-keyed read the pattern above cannot see
_ALIAS = re.compile(rf"^\s*\w+ = (?:ctx\.)?cfg\.(?:{'|'.join(BLOCKS)})\s*$", re.MULTILINE)


def test_no_block_is_kept_under_a_name_to_read_keys_from():
    found = [(str(path.relative_to(ROOT)), match.group(0).strip()) for folder in ("pipeline", "models", "data_prep")
             for path in sorted((ROOT / folder).rglob("*.py")) for match in _ALIAS.finditer(path.read_text())]
    # StageSelection.of: the engine's typed view of the `pipeline` block, made where a run is planned
    assert found == [("pipeline/engine/settings.py", "p = cfg.pipeline")]
