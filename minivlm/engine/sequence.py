"""Per-request state while a request lives in the scheduler: tokens, positions, where its images' rows are, keys.
It holds no pixels and no image embeddings: the runner keeps those (engine/encoder/encoder_cache.py). Its progress
(computed tokens, tokens, keys, logprobs) is written only by EngineCore.update
once the engine has admitted it: anywhere else a write raises (the plan is the only writer)."""
import contextlib
import itertools
import threading

import torch

from minivlm.inputs.image_layout import runs
from minivlm.inputs.prompt import Prompt
from minivlm.engine.outputs import CacheHit
from minivlm.engine.request import Request, RequestStatus, SamplingParams


_seq_ids = itertools.count()


GUARDED = frozenset({"num_computed", "logprobs", "cache_hits", "num_cached_tokens"})
_writer = threading.local()  # .open is True on the thread inside EngineCore.update


class StateWriteError(RuntimeError):
    """A sealed request's progress written outside EngineCore.update."""


@contextlib.contextmanager
def writing():
    """The window in which EngineCore.update (and only it) writes request progress."""
    _writer.open = True
    try:
        yield
    finally:
        _writer.open = False


def image_runs(images, token_types: list[int]) -> list[tuple[int, int, int, int]]:
    """(first token, image, first row, tokens) of each run of one image's placeholder tokens: an image's tokens may
    be several runs (a tiled image's markers, a video's timestamps between frames), its rows count on across them."""
    out, i, row = [], 0, 0
    for a, b in runs(token_types) if images else ():
        while a < b:
            while a >= images[i].end and i + 1 < len(images):
                i, row = i + 1, 0
            n = min(b, images[i].end) - a if a < images[i].end else b - a
            out.append((a, i, row, n))
            a, row = a + n, row + n
    return out


class Sequence:
    """One submission of a request inside the engine. Tokens [0, num_computed) have their K/V in the blocks of
    its block table (KVCacheCoordinator.table). seq_id is internal and unique per submission; request_id is the caller's label."""

    def __init__(self, request: Request, prompt: Prompt, params: SamplingParams, positions: torch.Tensor,
                 rope_delta: int, seed: int | None):
        self.seq_id = next(_seq_ids)
        self.request_id = request.request_id
        self.cache_salt = request.cache_salt
        self.params = params
        self.token_ids = list(prompt.token_ids)
        self.token_types = list(prompt.token_types)
        self.num_prompt_tokens = len(self.token_ids)
        self.generation_tokens = prompt.generation_tokens  # the template's generation prompt, at the prompt's end
        self.prompt_positions = positions       # [3, num_prompt_tokens]
        self.rope_delta = rope_delta
        self.images = prompt.images                # ImageInfo of each image: where its tokens are, its layout
        self.vision_keys: tuple[str, ...] = ()    # each image's encoder-cache key (set by intake)
        self.image_runs = image_runs(prompt.images, self.token_types)  # (token, image, first row, rows) per run
        self.arrived_step = 0                      # the engine step that admitted it
        self.submitted_at: float | None = None    # when it reached the engine's inbox (EngineCore.clock)
        self.seed = seed                            # its RNG's seed (temperature > 0; the runner owns the RNG)
        self.block_keys: list[str] = []    # key of each full block under the engine's strategy
        self.truth_keys: list[str] = []    # strategy-C key of each full block (ground truth for false hits)
        self.block_extras: list[tuple] = []  # the extra key material of each block_keys entry
        self.num_computed = 0
        self.num_cached_tokens = 0
        self.cache_hits: list[CacheHit] = []
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.detokenizer = None                     # the output path's per-request text state
        self.matcher = None                         # structured outputs: its grammar's state (engine/sampling/structured_output.py)
        self.choice_index = 0                       # n > 1: which of the request's choices this is
        self._status: RequestStatus | None = None  # None until the engine admits it (lifecycle.py writes it)
        self.sink = None                            # the submitting caller's RequestHandle (thread-safe)
        self.wants_snapshot = False                 # attach a KVSnapshot to this request's events

    @property
    def status(self) -> RequestStatus | None:
        return self._status

    def set_status(self, status: RequestStatus):  # engine/lifecycle.py's transitions only
        object.__setattr__(self, "_status", status)

    @property
    def sealed(self) -> bool:
        """Admitted: from now on only EngineCore.update writes its progress."""
        return self.__dict__.get("_status") is not None

    @property
    def finish_reason(self) -> str | None:
        return None if self._status is None else self._status.finish_reason

    def __setattr__(self, name, value):
        if name in GUARDED and self.sealed and not getattr(_writer, "open", False):
            raise StateWriteError(f"{name} of request {self.request_id} is written only by EngineCore.update")
        object.__setattr__(self, name, value)

    def check_writable(self, what: str):
        """Raise unless progress may be written now (in-place writes: tokens and keys)."""
        if self.sealed and not getattr(_writer, "open", False):
            raise StateWriteError(f"{what} of request {self.request_id} are written only by EngineCore.update")

    def __len__(self) -> int:
        return len(self.token_ids)

    def image_rows(self, start: int, end: int) -> tuple[tuple[int, int, int], ...]:
        """The image placeholders among tokens [start, end) in token order, as runs (image, first row, rows): rows
        of that image's encoder output."""
        return tuple((i, row + max(start - a, 0), min(end, a + n) - max(start, a))
                     for a, i, row, n in self.image_runs if a < end and a + n > start)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    def positions(self, start: int, end: int) -> torch.Tensor:
        """M-RoPE positions [3, end-start] of tokens start..end-1 (generated tokens: index + rope delta)."""
        parts = []
        if start < self.num_prompt_tokens:
            parts.append(self.prompt_positions[:, start:min(end, self.num_prompt_tokens)])
        if end > self.num_prompt_tokens:  # the same index in t, row and col
            parts.append(torch.arange(max(start, self.num_prompt_tokens) + self.rope_delta, end + self.rope_delta)
                         .expand(3, -1))
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def append_token(self, token_id: int):
        self.check_writable("tokens")
        self.token_ids.append(token_id)
        self.token_types.append(0)

    def block_tokens(self, i: int, block_size: int) -> list[int]:
        return self.token_ids[i * block_size:(i + 1) * block_size]
