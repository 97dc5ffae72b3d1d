"""`python -m pipeline +experiment=NAME [overrides]` (Hydra; `--help` lists the config groups)."""
import sys

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline import CONF_DIR
from pipeline.config import check_overrides_into_null_blocks, check_renamed_names, check_whole_map_overrides
from pipeline.runner import finetune_objective, run_pipeline  # registers the config schema (pipeline/config.py)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the sweep objective (finetune_objective); a single run ignores it."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.RUN and "sweep" in hydra_cfg.runtime.choices:  # a single run ignores the sweeper
        raise SystemExit(f"error: +sweep={hydra_cfg.runtime.choices.sweep} configures a sweep, which Hydra runs with "
                         "-m: python -m pipeline -m ...")
    return finetune_objective(run_pipeline(cfg))


def _compose(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


if __name__ == "__main__":
    overrides = [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")]
    check_renamed_names(overrides)
    check_overrides_into_null_blocks(overrides, _compose)
    check_whole_map_overrides(overrides, _compose)
    main()
