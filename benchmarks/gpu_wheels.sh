#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.py needs on a lent GPU machine beyond what its image has (PyTorch, Lightning,
# transformers, tokenizers, pyarrow, ... are there; docs/gpu.md): Hydra and OmegaConf (the pipeline's config, with
# antlr4), DeepSpeed (the trainer=deepspeed_stage_2 phase) and its pydantic and hjson. That machine reaches no package
# index, so they travel with the working tree in .whl/ (ignored by git), at the versions this checkout's .venv tests,
# built for its Python 3.12 on x86-64. Run from anywhere, after `make install`:
#     bash benchmarks/gpu_wheels.sh            # then pass carry=[".whl"] with docs/gpu.md's command
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")" .whl
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
rm -f .whl/*.whl

version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
binary=(hydra-core omegaconf pydantic pydantic_core annotated-types typing-inspection typing_extensions hjson)
from_source=(antlr4-python3-runtime deepspeed)  # published as source only: built here (both pure Python)

pins=()
for name in "${binary[@]}"; do pins+=("$name==$(version "$name")"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${pins[@]}"
for name in "${from_source[@]}"; do
    # deepspeed's setup.py imports torch: built against the venv's, without isolation; no op is prebuilt (the
    # check uses torch's AdamW, which needs none)
    "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$name==$(version "$name")"
done
ls -la .whl
du -sh .whl
