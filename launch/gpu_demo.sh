#!/usr/bin/env bash
# `realm-jax demo --preset=gpu` on a GPU machine without TensorFlow, from the
# repository root with the bundle of `make bundle-gpu` in bundle/:
#
#   launch/gpu_demo.sh [WORK_DIR]
#
# Installs the bundle's wheels into /tmp/site, checks the bundle, then runs
# every stage into WORK_DIR (default runs/gpu; a re-run skips the finished
# stages). The report lands in WORK_DIR and, as the record, in
# docs/results/gpu.* (the next run plans from it).
set -euo pipefail
work_dir=${1:-runs/gpu}
python3 -m pip install -q --no-index --no-deps --target /tmp/site \
  bundle/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD REALM_CORPUS_DIR=$PWD/bundle/corpora \
  REALM_ARRAYS_DIR=$PWD/bundle/arrays REALM_VOCAB=$PWD/bundle/minilm/vocab.txt \
  PYTHONUNBUFFERED=1
python3 -m launch.bundle --check bundle
python3 -m realm_jax.main demo --preset=gpu --work_dir="$work_dir" --record
