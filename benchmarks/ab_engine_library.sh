#!/usr/bin/env bash
# Interleaved before/after runs for the engine-library change (issue 31):
# BEFORE and AFTER are two built trees (PYTHONPATH roots); each round runs
# benchmarks/allreduce.py at np=2 and np=3 for both, in alternating order,
# then the model-level benchmark (mnist: kd np=2 and the two-process
# ceiling), also in alternating order per round.
# Writes JSON and logs to benchmarks/results/ab_engine_library/.
#   bash benchmarks/ab_engine_library.sh /path/before /path/after [rounds]
set -euo pipefail
BEFORE=$1 AFTER=$2 ROUNDS=${3:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$HERE/results/ab_engine_library
BIN=$(dirname "$(command -v python)")
mkdir -p "$OUT"
run() {  # tag root np round
  local tag=$1 root=$2 np=$3 round=$4
  PYTHONPATH=$root TF_CPP_MIN_LOG_LEVEL=2 timeout 900 "$BIN/mpiexec" -n "$np" python \
    "$AFTER/benchmarks/allreduce.py" --sizes 4K 64K 1M 16M --blocks 3 \
    --json "$OUT/allreduce_np${np}_${tag}_r${round}.json" > "$OUT/allreduce_np${np}_${tag}_r${round}.log" 2>&1
}
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order="before after"; else order="after before"; fi
  for np in 2 3; do
    for tag in $order; do
      root=$([ "$tag" = before ] && echo "$BEFORE" || echo "$AFTER")
      run "$tag" "$root" "$np" "$r"
    done
  done
done
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then order="after before"; else order="before after"; fi
  for tag in $order; do
    root=$([ "$tag" = before ] && echo "$BEFORE" || echo "$AFTER")
    PYTHONPATH=$root TF_CPP_MIN_LOG_LEVEL=2 timeout 1200 python "$AFTER/benchmarks/keras_synthetic.py" \
      --models mnist --configs kd_np2_t1 keras_2x_t1 --steps 100 \
      --json "$OUT/keras_mnist_${tag}_r${r}.json" --png "$OUT/keras_mnist_${tag}_r${r}.png" \
      > "$OUT/keras_mnist_${tag}_r${r}.log" 2>&1 || echo "keras_synthetic $tag failed" >&2
  done
done
echo done
