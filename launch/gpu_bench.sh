#!/usr/bin/env bash
# The accelerator benchmarks (docs/benchmarks.md, "On a GPU") on a GPU
# machine, from the repository root:
#
#   launch/gpu_bench.sh [more flags of python -m benchmarks.run]
#
# What it does:
#   - gin-config and google-crc32c, which the model code imports, come
#     from the bundle's wheels (bundle/wheels/*.whl, `make bundle-gpu`; for
#     this command alone `pip download --no-deps -d bundle/wheels
#     gin-config==0.5.0 google-crc32c==1.9.0` is enough) installed into
#     /tmp/site (SITE_DIR) with no network, unless the image has them;
#   - MiniLM-L6's weights are read from bundle/minilm when it is there;
#   - `python -m benchmarks.run --accelerator` runs every row in
#     BUDGET_S seconds (default 380), each benchmark in its share: a row
#     that would not fit is not started, and its table says so;
#   - a hard stop at HARD_LIMIT_S (default 415 s, under 7 minutes): the
#     benchmarks finished by then are in the JSON, every row in the log.
# Results go to $OUT (default benchmarks/results): the JSON
# (<device>-x<count>-<date>-accelerator.json), gpu_bench.log (every row and
# the tables in docs/benchmarks.md's format) and nvidia-smi.txt.
set -euo pipefail
out=${OUT:-benchmarks/results}
budget=${BUDGET_S:-380}
hard_limit=${HARD_LIMIT_S:-415}
mkdir -p "$out"
site=${SITE_DIR:-/tmp/site}
if ! python3 -c 'import gin, google_crc32c' 2>/dev/null; then
  shopt -s nullglob
  wheels=(bundle/wheels/*.whl)
  if ((${#wheels[@]} == 0)); then
    echo "gin-config or google-crc32c is not installed and bundle/wheels/" \
      "holds no wheel: put the bundle of make bundle-gpu in bundle/, or" \
      "pip install gin-config google-crc32c." >&2
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --target "$site" \
    "${wheels[@]}"
fi
export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# JAX takes 85% of the GPU's memory at its first use; PyTorch's encoder
# rows run in the rest and hand their cache back before the JAX rows.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.85}
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
status=0
timeout -k 10 "$hard_limit" python3 -m benchmarks.run --accelerator \
  --budget_s="$budget" --output_dir="$out" "$@" 2>&1 \
  | tee "$out/gpu_bench.log" || status=$?
if ((status == 124)); then
  echo "stopped at the hard limit of ${hard_limit} s: the benchmarks" \
    "finished by then are in $out; gpu_bench.log has every row." \
    | tee -a "$out/gpu_bench.log"
fi
exit "$status"
