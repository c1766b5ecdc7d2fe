#!/usr/bin/env bash
# rms_norm's CUDA kernels of this tree against those of another tree (OLD), alternated new/old on one machine so
# that clock and thermal drift fall on both: benchmarks/rms_norm_peers.py, opforge only, its three shapes in
# float32, bfloat16 and float16, forward and backward, ROUNDS times each. Markdown tables under $OUT/ab.
#
#   git archive REV opforge specs benchmarks pyproject.toml | (mkdir -p .gpucarry/old && tar -x -C .gpucarry/old)
#   OUT=reports/gpu benchmarks/rms_norm_ab.sh .gpucarry/old [ROUNDS]
#
# On the device machine the tree travels without .git: make OLD here, in a git-ignored folder, and carry it.
set -uo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: benchmarks/rms_norm_ab.sh OLD_TREE [ROUNDS]: expected the folder of the other tree. Make it with git archive.}
ROUNDS=${2:-2}
OUT=${OUT:-reports/gpu}
mkdir -p "$OUT/ab"
ARGS=(--contender opforge --dtypes float32,bfloat16,float16)
# Both builds first, so that no timed run shares the machine with nvcc.
python -m opforge build --require-cuda specs/rms_norm.yaml >"$OUT/ab/build-new.txt" 2>&1 || exit 1
(cd "$OLD" && python -m opforge build --require-cuda specs/rms_norm.yaml) >"$OUT/ab/build-old.txt" 2>&1 || exit 1
for round in $(seq "$ROUNDS"); do
  python benchmarks/rms_norm_peers.py "${ARGS[@]}" --markdown "$OUT/ab/new-$round.md" >"$OUT/ab/new-$round.txt" 2>&1
  (cd "$OLD" && python benchmarks/rms_norm_peers.py "${ARGS[@]}" --markdown "$OUT/ab/old-$round.md") \
    >"$OUT/ab/old-$round.txt" 2>&1
  echo "round $round of $ROUNDS done at $SECONDS s"
done
