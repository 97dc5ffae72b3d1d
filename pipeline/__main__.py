"""`python -m pipeline +experiment=NAME [overrides]` (Hydra; `--help` lists the config groups)."""
import hydra
from omegaconf import DictConfig

from pipeline.runner import finetune_objective, run_pipeline


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the sweep objective (finetune_objective); a single run ignores it."""
    return finetune_objective(run_pipeline(cfg))


if __name__ == "__main__":
    main()
