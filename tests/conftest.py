import os

import pytest
import torch

from minivlm.families import QWEN_VL

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
# engines keep their thread count whatever else the machine runs (a browser, an app server the tests started): outputs
# compared across runs must not depend on it (oneDNN sums in another order on other thread counts);
# tests/test_busy_threads.py turns it back on for itself
os.environ.setdefault("MINIVLM_BUSY_THREADS", "0")

FAMILIES = list(QWEN_VL)  # qwen2_vl, qwen2_5_vl, qwen3_vl
# the rest of the model matrix: (name, family, InternVL's text decoder); tests/test_matrix*.py run them
MATRIX = [("smolvlm", "smolvlm", None), ("idefics3", "idefics3", None), ("internvl", "internvl", "qwen3"),
          ("internvl_qwen2", "internvl", "qwen2"), ("qwen2", "qwen2", None), ("qwen3", "qwen3", None)]


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


@pytest.fixture(scope="session")
def matrix_checkpoints(tmp_path_factory):
    """Random-weight checkpoints of the other families in their published layout (tiny: 64-px tiles)."""
    from tools.make_checkpoint_matrix import make_matrix_checkpoint
    root = tmp_path_factory.mktemp("matrix")
    return {name: make_matrix_checkpoint(fam, str(root / name), seed=10 + i, decoder=dec, tie=name == "qwen2")
            for i, (name, fam, dec) in enumerate(MATRIX)}


@pytest.fixture(scope="session")
def matrix_engines(matrix_checkpoints):
    from minivlm import Engine, EngineConfig
    return {name: Engine(EngineConfig(model=path, num_blocks=256, dtype="float32", device="cpu", max_model_len=1024))
            for name, path in matrix_checkpoints.items()}


@pytest.fixture(scope="session")
def tiny_app_process(tmp_path_factory):
    """`python app.py --num-blocks 256 --allowed-media-domains 127.0.0.1` (the shipped tiny model and its own pool;
    the API may fetch images from this machine only), started as a process once for the modules that talk to it as
    clients (test_app_classroom.py, test_app_client.py, test_image_memory.py, test_openai_api.py,
    test_openai_structured.py): a start imports torch, gradio and transformers (10-20 s on 2 cores). A test that
    rebuilds its engine puts the start settings back; one that pauses it resumes it."""
    from tests.app_server import running_app
    with running_app("--num-blocks", "256", "--allowed-media-domains", "127.0.0.1",
                     log_path=str(tmp_path_factory.mktemp("app") / "app.log")) as url:
        yield url


@pytest.fixture(scope="session")
def shared_app_process(tmp_path_factory):
    """`python app.py --shared` as a public deployment runs it (tests/app_server.py's SHARED_*: a 128-block pool,
    uploads of 1 MB at most kept 2 s, an operator token in $MINIVLM_ADMIN_TOKEN and two API keys in
    $MINIVLM_API_KEY), started as a process once for test_openai_serving.py and test_shared_deployment.py (a start
    costs 10-20 s on 2 cores); yields (url, log path). A test that rebuilds its engine puts the start settings back."""
    from tests.app_server import SHARED_ADMIN_TOKEN, SHARED_API_KEYS, SHARED_NUM_BLOCKS, running_app
    log = str(tmp_path_factory.mktemp("shared") / "app.log")
    with running_app("--num-blocks", str(SHARED_NUM_BLOCKS), "--shared", "--max-file-size", "1mb", "--upload-ttl", "2",
                     log_path=log, env={"MINIVLM_ADMIN_TOKEN": SHARED_ADMIN_TOKEN,
                                        "MINIVLM_API_KEY": SHARED_API_KEYS}) as url:
        yield url, log


def pytest_sessionfinish(session, exitstatus):
    """The browser tests share one headless chromium (tests/app_server.py's shared_browser): close it last."""
    from tests.app_server import close_browsers
    close_browsers()
