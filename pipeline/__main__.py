"""`python -m pipeline +experiment=NAME [overrides]` (Hydra; `--help` lists the config groups)."""
import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline.runner import finetune_objective, run_pipeline  # registers the config schema (pipeline/config.py)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the sweep objective (finetune_objective); a single run ignores it."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.RUN and "sweep" in hydra_cfg.runtime.choices:  # a single run ignores the sweeper
        raise SystemExit(f"error: +sweep={hydra_cfg.runtime.choices.sweep} configures a sweep, which Hydra runs with "
                         "-m: python -m pipeline -m ...")
    return finetune_objective(run_pipeline(cfg))


if __name__ == "__main__":
    main()
