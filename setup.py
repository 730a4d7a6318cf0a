"""realm-jax: REALM retrieval-augmented language model pre-training in JAX."""

import setuptools

# The set known to work together on Python 3.11. scann's TF ops are
# built against TF 2.20, so TensorFlow and tensorflow-text stay pinned.
INSTALL_REQUIRES = [
    'jax==0.10.2',
    'jaxlib==0.10.2',
    'flax==0.12.8',
    'optax==0.2.8',
    'orbax-checkpoint==0.12.8',
    'seqio==0.0.20',
    'tensorflow==2.20.0',
    'tensorflow-text==2.20.1',
    'scann==1.4.2',
    'gin-config==0.5.0',
    'clu==0.0.12',
    'safetensors>=0.4',
    'spacy>=3.7.5,<3.9',
    'matplotlib>=3.8',
    'regex>=2023.0',  # DPR's has_answer: its tokenizer's \p{L} classes.
    'numpy',
]
# The benchmarks' peers: faiss-cpu, and Hugging Face's PyTorch BERT (the CPU
# wheel of torch; transformers at a release that loads it).
BENCH = ['faiss-cpu>=1.8', 'torch==2.13.0', 'transformers==5.23.0']

setuptools.setup(
    name='realm-jax',
    version='0.1.0',
    description='REALM (Guu et al. 2020) retrieval-augmented pre-training in JAX',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.11,<3.12',
    packages=setuptools.find_packages(include=['realm_jax', 'realm_jax.*',
                                               'benchmarks',
                                               'tasks', 'tasks.*',
                                               'launch', 'launch.*']),
    install_requires=INSTALL_REQUIRES,
    extras_require={'test': ['pytest>=8', 'hypothesis>=6.100', *BENCH],
                    'bench': BENCH},
    entry_points={'console_scripts': ['realm-jax=realm_jax.main:run']},
    license='Apache-2.0',
)
