import os

import pytest
import torch

from minivlm.families import FAMILIES as REGISTRY

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

FAMILIES = list(REGISTRY)  # qwen2_vl, qwen2_5_vl, qwen3_vl


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """Random-weight tiny checkpoints of all three families, built by the tests themselves."""
    from tools.make_checkpoint import make_random_checkpoint
    root = tmp_path_factory.mktemp("ckpt")
    return {fam: make_random_checkpoint(fam, str(root / fam), seed=i) for i, fam in enumerate(FAMILIES)}


@pytest.fixture(scope="session")
def engines(checkpoints):
    """One fp32 engine per family (strategy C, a small pool)."""
    from minivlm import Engine, EngineConfig
    return {fam: Engine(EngineConfig(model=path, num_blocks=256, dtype="float32", device="cpu", max_model_len=1024))
            for fam, path in checkpoints.items()}


@pytest.fixture(scope="module")
def engine(checkpoints):
    """A 40-block fp32 pool: eight concurrent requests share blocks and get preempted (a module may define its own)."""
    from minivlm import Engine, EngineConfig
    with Engine(EngineConfig(model=checkpoints["qwen3_vl"], device="cpu", dtype="float32", num_blocks=40,
                             max_model_len=512)) as e:
        yield e
