"""The project's Hydra sweeper (optuna_ray_sweeper.py). Hydra loads plugins only from the `hydra_plugins` namespace
package, which therefore has no __init__.py of its own."""
