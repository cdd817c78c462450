"""Starting the app wrong says so in one line (#40 item 4): `python app.py --device cuda` without CUDA (and --device
mps off a Mac, a missing or broken --model, a bad --watch-kv-events / --kv-events-config, a port already taken)
used to print a 15-line traceback; now one line on stderr says what is wrong and what to do, and the process exits
with code 2. --device auto without a GPU warns and runs on the CPU. The running app's hint names --share, not
Gradio's `share=True` in `launch()`; a KV-watch address refused from the page is one line in the log."""
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from minivlm import EngineConfig
from tests.app_server import ROOT, free_port, running_app

NO_CUDA = not torch.cuda.is_available()
NO_MPS = not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
START_S = 180  # importing gradio, torch and transformers takes seconds; a loaded CI machine, several times that


def start(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("SPACE_ID", None)
    return subprocess.run([sys.executable, "app.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=START_S)


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Checkpoints copied from the shipped tiny model: truncated weights, no tokenizer files, an unreadable config."""
    root = tmp_path_factory.mktemp("broken")
    out = {}
    for name in ("truncated", "no-tokenizer", "bad-config"):
        out[name] = str(shutil.copytree(EngineConfig().model, root / name))
    weights = os.path.join(out["truncated"], "model.safetensors")
    with open(weights, "rb") as f:
        head = f.read(1000)
    with open(weights, "wb") as f:
        f.write(head)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(os.path.join(out["no-tokenizer"], name))
    with open(os.path.join(out["bad-config"], "config.json"), "w") as f:
        f.write('{"model_type": "qwen3_vl", ')
    return out


SLOW = pytest.mark.slow  # each case starts Python with gradio, torch and transformers (about 10-14 s): the default
# run keeps one bad start (a device) and the running app's test (which also logs a refused watch); CI's -m slow runs
# the rest
CASES = [
    (["--device", "cuda"], "--device cuda is not available here", NO_CUDA),
    pytest.param(["--device", "mps"], "--device mps is not available here", NO_MPS, marks=SLOW),
    pytest.param(["--device", "cpu", "--model", "/nonexistent"], "'/nonexistent' is neither a local checkpoint directory",
                 True, marks=SLOW),
    pytest.param(["--device", "cpu", "--model", "{truncated}"], "corrupt weights file model.safetensors", True,
                 marks=SLOW),
    pytest.param(["--device", "cpu", "--model", "{no-tokenizer}"], "has no tokenizer: tokenizer.json is missing", True,
                 marks=SLOW),
    pytest.param(["--device", "cpu", "--model", "{bad-config}"], "has no readable config.json", True, marks=SLOW),
    pytest.param(["--device", "cpu", "--watch-kv-events", "tcp://127.0.0.1"], "cannot watch 'tcp://127.0.0.1'", True,
                 marks=SLOW),
    pytest.param(["--device", "cpu", "--watch-kv-events", "127.0.0.1:5557"], "watch an address like tcp://host:5557",
                 True, marks=SLOW),
    pytest.param(["--device", "cpu", "--kv-events-config", "{bad"], "kv_events: not valid JSON", True, marks=SLOW),
]


@pytest.mark.parametrize("args, says, applies", CASES,
                         ids=[" ".join((c.values if hasattr(c, "values") else c)[0][-2:]) for c in CASES])
def test_a_bad_start_is_one_line_and_a_clean_exit(broken, args, says, applies):
    if not applies:
        pytest.skip("this machine has that device")
    args = [a.format(**broken) if a.startswith("{") and a[1:-1] in broken else a for a in args]
    began = time.monotonic()
    done = start(*args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith("minivlm: error: ") and says in lines[0], lines[0]
    assert done.stdout.strip() == ""  # nothing was served, no status line
    assert time.monotonic() - began < START_S


@SLOW
def test_a_port_already_taken_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = start("--device", "cpu", "--port", str(port))
    errors = [line for line in done.stderr.strip().splitlines() if line.startswith("minivlm: error:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert errors == [f"minivlm: error: cannot serve on 127.0.0.1:{port}: Cannot find empty port in range: "
                      f"{port}-{port}; choose another with --port or --host"], done.stderr


def test_a_running_app_names_its_own_flags_and_logs_a_refused_watch_in_one_line(checkpoints, tmp_path):
    """--device auto with a real (random-weight, 2.5 MiB) checkpoint on a machine without a GPU: the CPU, and no
    warning (its weights are far below a GiB); the share hint says --share; a Watch of a bad address through the page's API: one line in the log."""
    from gradio_client import Client
    log = tmp_path / "app.log"
    with running_app("--device", "auto", "--model", checkpoints["qwen2_vl"], log_path=str(log)) as url:
        deadline = time.monotonic() + 30
        while "public link" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        client = Client(url, verbose=False)
        with pytest.raises(Exception, match="cannot watch 'tcp://127.0.0.1'"):
            client.predict("tcp://127.0.0.1", "", api_name="/kv_watch")
        with pytest.raises(Exception, match="watch an address like"):
            client.predict("nonsense", "", api_name="/kv_watch")
        time.sleep(1)
        text = log.read_text()
    assert "* To create a public link, start the app with --share." in text and "share=True" not in text
    assert "Traceback" not in text, text[-3000:]
    refused = [line for line in text.splitlines() if "KV watch of" in line]
    assert len(refused) == 2 and "refused: cannot watch 'tcp://127.0.0.1'" in refused[0], refused
    # a 2.5 MiB checkpoint on the CPU is quick: no "slow for this model" (#52.5; the rule: tests/test_device.py)
    assert "found no GPU" not in text and "slow for this model" not in text, text[-3000:]


@pytest.mark.slow  # one of the default run's longest (> 20 s on 2 cores); CI runs it with -m slow
def test_the_app_prints_its_url_and_its_status_line_with_speculation_on_stdout(tmp_path):
    """#52.5 / #52.4: `python app.py` says on stdout where it serves (Gradio's own line is quiet) and its status line
    says speculative decoding is on and how; the URL printed is the one that serves the page. The tiny model on the
    CPU under --device auto gets no "slow" warning."""
    port = free_port()
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, "prompt_lookup_min": 2}'
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
    env.pop("SPACE_ID", None)
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "app.py", "--device", "auto", "--port", str(port),
                                 "--speculative-config", spec], cwd=ROOT, env=env, stdout=o, stderr=e)
    try:
        deadline = time.monotonic() + START_S
        while "Running on local URL" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        lines = out.read_text().splitlines()
        url = next((line.split()[-1] for line in lines if line.startswith("* Running on local URL:")), None)
        assert url == f"http://127.0.0.1:{port}/", (lines, err.read_text()[-3000:])
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and b"minivlm" in page.read()
    finally:
        proc.terminate()
        proc.wait(30)
    status = next(line for line in lines if line.startswith("**"))
    assert status.endswith(" · speculative decoding: ngram (prompt lookup), up to 3 guessed tokens a step, matching "
                           "the last 2–5 tokens"), status
    assert "minivlm: warning" not in err.read_text()
