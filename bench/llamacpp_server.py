"""A llama-server process for the bench and its HTTP client: the server is started once per GGUF (its start-up
is not timed), requests go to its native /completion endpoint with the image as base64 multimodal data."""
import base64
import io
import json
import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

# llama-server draws a random image placeholder per run unless pinned by this variable; mtmd adds
# <|vision_start|>/<|vision_end|> around the image itself
MEDIA_MARKER = "<__media__>"
VISION_SPAN = "<|vision_start|><|image_pad|><|vision_end|>"  # what the chat template renders for one image


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(binary: str, model: str, mmproj: str, port: int, threads: int, slots: int,
                   slot_ctx: int = 512) -> list:
    """llama-server with continuous batching over `slots` slots, the given CPU threads for decode and batch
    (prompt) work, no prompt cache kept across requests (every repeat is new work, as for the engine)."""
    return [binary, "-m", model, "--mmproj", mmproj, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-cb", "-c", str(slots * slot_ctx),
            "--cache-ram", "0", "--no-webui"]


def llama_prompt(processor, request) -> str:
    """The prompt text the engine renders (same chat template), with each image as mtmd's media marker."""
    text = processor.apply_chat_template(request.to_messages(), tokenize=False, add_generation_prompt=True)
    if text.count(VISION_SPAN) != len(request.images):
        raise ValueError(f"expected {len(request.images)} image spans {VISION_SPAN!r} in the rendered prompt")
    return text.replace(VISION_SPAN, MEDIA_MARKER)


def png_base64(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def completion_body(prompt: str, images: list, new_tokens: int, logprobs: bool = False) -> dict:
    """Greedy, EOS ignored, exactly `new_tokens` tokens, token ids returned, no prompt cache; with logprobs, each
    token's log-probability from the raw logits (n_probs 1, not post-sampling: top_k 1 would make it 0)."""
    body = {"prompt": {"prompt_string": prompt, "multimodal_data": [png_base64(im) for im in images]},
            "n_predict": new_tokens, "ignore_eos": True, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
            "return_tokens": True, "stream": False}
    return {**body, "n_probs": 1, "post_sampling_probs": False} if logprobs else body


def request_body(processor, request, new_tokens: int, logprobs: bool = False) -> dict:
    """The /completion body for one engine Request: same prompt text and images, `new_tokens` greedy tokens."""
    return completion_body(llama_prompt(processor, request), request.images, new_tokens, logprobs)


def chunk_logprobs(chunk: dict) -> list[float]:
    """The chosen tokens' log-probabilities in one streamed chunk (empty when none were asked for)."""
    return [p["logprob"] for p in chunk.get("completion_probabilities", [])]


class LlamaServer:
    """A running llama-server (context manager: started on enter, stopped on exit), its log in `log_path`."""

    def __init__(self, command: list, port: int, log_path: str, start_timeout: float = 900.0):
        self.command, self.port, self.log_path, self.start_timeout = command, port, log_path, start_timeout
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None
        self.retries = 0  # requests whose connection the server closed unanswered and that were sent again

    def __enter__(self):
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "LLAMA_MEDIA_MARKER": MEDIA_MARKER})
        try:
            self._wait_ready()
        except BaseException:  # `with` calls __exit__ only after __enter__ returned: stop the process here
            self.__exit__()
            raise
        return self

    def _wait_ready(self):
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except (httpx.ConnectError, httpx.TimeoutException):  # not listening yet, or busy loading
                pass
            time.sleep(0.5)
        raise TimeoutError(f"llama-server not ready after {self.start_timeout:.0f}s; see {self.log_path}")

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def complete(self, body: dict) -> dict:
        try:
            reply = httpx.post(self.url + "/completion", json=body, timeout=600)
        except (httpx.ConnectError, httpx.RemoteProtocolError):  # seen on a starved machine: closed unanswered
            self.retries += 1
            reply = httpx.post(self.url + "/completion", json=body, timeout=600)
        if reply.status_code != 200:
            raise RuntimeError(f"llama-server /completion {reply.status_code}: {reply.text[:300]}")
        return reply.json()

    def stream(self, body: dict, logprobs: list = None) -> tuple[list[float], list[int], dict]:
        """One streamed request: the arrival time of each token, the token ids, and the final chunk (timings);
        each token's log-probability is appended to `logprobs` when given (the body must ask for them)."""
        times, tokens, last = [], [], {}
        with httpx.stream("POST", self.url + "/completion", json={**body, "stream": True}, timeout=600) as r:
            if r.status_code != 200:
                raise RuntimeError(f"llama-server /completion {r.status_code}: {r.read()[:300]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                last = json.loads(line[6:])
                if last.get("tokens"):
                    times.append(time.perf_counter())
                    tokens += last["tokens"]
                if logprobs is not None:
                    logprobs += chunk_logprobs(last)
        return times, tokens, last

    def complete_all(self, bodies: list[dict]) -> list[dict]:
        """Send every request at once (one connection each) and wait for all: the server batches them."""
        with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
            return list(pool.map(self.complete, bodies))


def start(binary: str, model: str, mmproj: str, threads: int, slots: int, log_dir: str) -> LlamaServer:
    """A LlamaServer on a free local port (not yet started: use it in a `with`)."""
    port = free_port()
    name = os.path.basename(model).replace(".gguf", "")
    return LlamaServer(server_command(binary, model, mmproj, port, threads, slots), port,
                       os.path.join(log_dir, f"llama-server-{name}-np{slots}.log"))
