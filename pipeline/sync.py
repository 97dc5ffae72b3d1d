"""`python -m pipeline.sync RUN_DIR`: upload a run's offline W&B runs, then record which artifacts each stage used.

Offline runs (the default) log their outputs as artifacts but W&B refuses `use_artifact` offline, so the engine
writes the edges to `<run_dir>/wandb_lineage.jsonl`; once the runs exist on the server, they are declared through
the public API and W&B shows the lineage graph prepare → bert_tokenizer → … → report."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pipeline.engine.tracking import LINEAGE_FILE


def lineage_edges(run_dir: Path) -> list[dict]:
    path = run_dir / LINEAGE_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def replay_lineage(edges: list[dict], api, entity: str, project: str) -> int:
    """Declare every recorded (run, used artifact) edge through `api` (a wandb.Api); returns the edge count."""
    count = 0
    for edge in edges:
        run = api.run(f"{entity}/{project}/{edge['run_id']}")
        for name in edge["uses"]:
            # "stage:hash" names a version by its alias; lineage written before artifacts had versions named
            # "stage-hash" artifacts of their own
            run.use_artifact(api.artifact(f"{entity}/{project}/{name}" + ("" if ":" in name else ":latest")))
            count += 1
    return count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--project", default="textrep", help="W&B project the runs were logged to (logger.project)")
    parser.add_argument("--entity", default=None, help="W&B entity; default: the logged-in user's")
    args = parser.parse_args(argv)
    offline = sorted((args.run_dir / "wandb").glob("offline-run-*"))
    if not offline:
        raise SystemExit(f"no offline W&B runs under {args.run_dir / 'wandb'}; was the run made with logger=wandb?")
    subprocess.run([sys.executable, "-m", "wandb", "sync", *map(str, offline)], check=True)
    import wandb

    api = wandb.Api()
    edges = lineage_edges(args.run_dir)
    print(f"declared {replay_lineage(edges, api, args.entity or api.default_entity, args.project)} artifact uses "
          f"for {len(edges)} stage runs")


if __name__ == "__main__":
    main()
