#!/bin/bash
# `opforge fuzz --device cuda` on the CUDA fixtures (tests/fixtures/cuda_ops): the misaligned kernel found and
# replayed at offsets 2-5 (4 is aligned for float32: it passes), the capped grid past its cap (2^25 elements allowed),
# the clean kernel silent; then the bundled CUDA ops, silent. Two parts, each inside one device call's 10 minutes:
# `bash benchmarks/fuzz_gpu.sh fixtures`, `bash benchmarks/fuzz_gpu.sh bundled`; logs in $OUT/fuzz_gpu_PART.tgz (the
# device returns at most 8 files).
export PYTHONUNBUFFERED=1
PART=${1:-fixtures}
pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
O=$(mktemp -d)
trap 'tar czf $OUT/fuzz_gpu_$PART.tgz -C $O .; exit' EXIT TERM
nvidia-smi -L | tee $O/gpu.txt; python -c "import torch, hypothesis; print(torch.__version__, hypothesis.__version__)" | tee -a $O/gpu.txt
F=tests/fixtures/cuda_ops
fz() { local name=$1; shift; local t=$(date +%s); python -m opforge fuzz "$@" --json $O/$name.json > $O/$name.log 2>&1; echo "$name exit $? $(( $(date +%s) - t ))s" | tee -a $O/summary.txt; tail -12 $O/$name.log; }
if [ "$PART" = fixtures ]; then
fz misaligned $F/misaligned_swish.yaml --device cuda --seed 0 -x --budget 90
for k in 2 3 4 5; do python -m opforge fuzz $F/misaligned_swish.yaml --device cuda --example "{\"dtype\": \"float32\", \"device\": \"cuda\", \"layout\": \"offset:$k\", \"shapes\": {\"x\": [1000]}, \"seed\": 1}" > $O/misaligned_offset$k.log 2>&1; echo "offset:$k exit $? $(head -c 200 $O/misaligned_offset$k.log)" | tee -a $O/summary.txt; done
fz capped $F/capped_grid_swish.yaml --device cuda --seed 0 -x --budget 150 --max-numel 33554432
fz clean $F/clean_swish.yaml --device cuda --seed 0 --budget 40
else
# The bundled ops with CUDA kernels: silent on the GPU too.
for s in leaky_swish leaky_swish_ leaky_swish_out affine_leaky_swish rms_norm custom_loss; do
  fz $s $s --device cuda --seed 0 --budget ${BUDGET:-30}
done
fi
