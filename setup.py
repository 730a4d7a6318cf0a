"""realm-jax: REALM retrieval-augmented language model pre-training in JAX."""

import setuptools

# The core: training, index building, exact search, evaluation, `ask`,
# `fill` and `search`, on the stack GPU and TPU images carry (Python 3.12,
# jax 0.11, CUDA 13) as well as on Python 3.11 with jax 0.10. Ranges, not pins:
# the versions known to work together on Python 3.11 are in constraints.txt,
# which `make setup` installs with (pip install -c constraints.txt ...).
INSTALL_REQUIRES = [
    'jax>=0.10.2',
    'jaxlib>=0.10.2',
    'flax>=0.12',
    'optax>=0.2.5',
    'orbax-checkpoint>=0.12',
    'gin-config>=0.5',
    'numpy>=2.0',
    'ml_dtypes>=0.5',  # released/tensor_files.py's bfloat16 (jax needs it too).
    'etils[epath]>=1.7',
    'safetensors>=0.4',
    'matplotlib>=3.8',
    'regex>=2023.0',  # DPR's has_answer: its tokenizer's \p{L} classes.
    'google-crc32c>=1.5',  # checksums.py: CRC-32C in compiled code.
]
# The TensorFlow stack (realm_jax/extras.py): building corpora from raw text,
# the seqio tasks, spaCy's salient-span annotation, ScaNN, the t5x adapter.
# scann's TF ops are built against TF 2.20 and tensorflow-text must match
# TensorFlow's minor version, so those two stay within 2.20.
TF = [
    'tensorflow>=2.20,<2.21',
    'tensorflow-text>=2.20,<2.21',
    'seqio>=0.0.20',
    'scann>=1.4.2,<1.5',
    'spacy>=3.7.5,<3.9',
    'clu>=0.0.12',
]
# The TPU compiler beside jax, for `realm-jax aot --target=tpu:...`: jax's
# own tpu extra pins the libtpu its jaxlib was built with. Then every
# `import jax` finds libtpu, and starts slower and warns on a machine
# without a TPU; `make setup` installs libtpu apart instead (.venv/libtpu),
# where only that command loads it.
TPU = ['jax[tpu]>=0.10.2']
# The benchmarks' peers: faiss-cpu, and Hugging Face's PyTorch BERT (the CPU
# wheel of torch; transformers at a release that loads it).
BENCH = ['faiss-cpu>=1.8', 'torch==2.13.0', 'transformers==5.23.0']
# `realm-jax export` and `import --export` write and read FAISS's index.
EXPORT = ['faiss-cpu>=1.8']

setuptools.setup(
    name='realm-jax',
    version='0.1.0',
    description='REALM (Guu et al. 2020) retrieval-augmented pre-training in JAX',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.11',
    # launch/ and benchmarks/ run from a checkout (python -m launch.pod):
    # they are not installed as top-level packages of their own.
    packages=setuptools.find_packages(include=['realm_jax', 'realm_jax.*']),
    install_requires=INSTALL_REQUIRES,
    extras_require={'tf': TF,
                    'test': ['pytest>=8', 'pytest-xdist>=3.6',
                             'hypothesis>=6.100', *BENCH,
                             # The export's parts, loaded as users load them.
                             'sentence-transformers==6.2.0'],
                    'bench': BENCH, 'export': EXPORT, 'tpu': TPU},
    entry_points={'console_scripts': ['realm-jax=realm_jax.main:run']},
    license='Apache-2.0',
)
