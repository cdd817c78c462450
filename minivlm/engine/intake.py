"""A request becomes a Sequence on the caller's thread: rendered, positioned, keyed and checked against the
engine's limits, so bad input raises at the caller and never reaches the engine loop. Its pixels stay out of the
Sequence: they wait beside it (`Intake.image_inputs`) for the core, which hands them to the runner on admission."""
import hashlib
import importlib.util
import itertools
import weakref

import torch

from minivlm.config import EngineConfig
from minivlm.loader import LoadedModel
from minivlm.model.rope import mrope_positions
from minivlm.inputs.prompt import Prompt, build_prompt
from minivlm.engine.encoder.encoder_cache import ImageInputs
from minivlm.engine.kv_cache.prefix_keys import extend_keys
from minivlm.engine.request import Request, SamplingParams
from minivlm.engine.sequence import Sequence
from minivlm.inputs.video_prompt import vision_runs
from minivlm.refusals import Refused

# the refusals a person meets, in English with their {fields} (a page says them again from the fields: error.<reason>)
PROMPT_TOO_LONG = "prompt is {n} tokens; max_model_len is {limit} (prompt + output)"
TOO_MANY_BLOCKS = "request needs up to {need} KV blocks but the engine has {have}; lower max_tokens or raise num_blocks"


def xgrammar_installed() -> bool:
    """Whether xgrammar can be imported (looked up, not imported: it loads only when a request asks for a grammar)."""
    return importlib.util.find_spec("xgrammar") is not None


class Intake:
    def __init__(self, config: EngineConfig, model: LoadedModel, num_blocks: int,
                 image_inputs: weakref.WeakKeyDictionary | None = None):
        self.config, self.model, self.num_blocks = config, model, num_blocks
        self.seed_counter = itertools.count()
        # Sequence -> its ImageInputs until the core admits it (EngineCore.image_inputs); weak: a sequence made and
        # never submitted takes its pixels with it
        self.image_inputs = image_inputs if image_inputs is not None else weakref.WeakKeyDictionary()
        self._grammars = None
        if config.structured_outputs_backend == "xgrammar" and not xgrammar_installed():
            raise ValueError("EngineConfig.structured_outputs_backend='xgrammar' but xgrammar is not installed (on a "
                             "CPU: pip install --no-deps xgrammar apache-tvm-ffi; 'auto' uses it where it is, else "
                             "llguidance)")

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.config.block_size)

    def make_sequence(self, request: Request, params: SamplingParams) -> Sequence:
        """Validate and render a request: processor, M-RoPE positions, block keys, length and pool checks."""
        if not isinstance(request, Request):
            raise Refused("invalid_value", "expected a minivlm.Request, got {type}", reason="request_type", param=None,
                          type=type(request).__name__)
        if not isinstance(params, SamplingParams):
            raise Refused("invalid_value", "expected minivlm.SamplingParams, got {type}", reason="params_type",
                          param=None, type=type(params).__name__)
        cfg, model = self.config, self.model
        prompt = build_prompt(model.family, model.processor, request.to_messages(), request.mm_processor_kwargs,
                              cfg.max_images_per_request, request.tools)
        n = len(prompt.token_ids)
        if n >= cfg.max_model_len:
            raise Refused("context_length_exceeded", PROMPT_TOO_LONG, reason="prompt_too_long", n=n,
                          limit=cfg.max_model_len)
        need = self.blocks_needed(min(n + params.max_tokens, cfg.max_model_len))
        if need > self.num_blocks:
            raise Refused("context_length_exceeded", TOO_MANY_BLOCKS, reason="too_many_blocks", param="max_tokens",
                          need=need, have=self.num_blocks)
        if model.family.mrope:
            grids, t_scales = vision_runs(prompt.images)  # a video may be several runs (Qwen3-VL's timestamps)
            positions, delta = mrope_positions(prompt.token_types, grids, model.merge, t_scales)
        else:  # 1-D RoPE: one counter, the same on all three axes; generated token i sits at i
            positions, delta = torch.arange(n).expand(3, -1), 0
        self.check_logit_bias(params)
        return self.choice(request, prompt, params, positions, delta, 0)

    def make_choices(self, request: Request, params: SamplingParams) -> list[Sequence]:
        """The request's n choices (SamplingParams.n): rendered once, each a sequence of its own with its own RNG
        (seed + i when seeded) and grammar state; the prefix cache shares their prompt's blocks."""
        first = self.make_sequence(request, params)
        pixels = self.image_inputs.get(first)
        prompt = Prompt(first.token_ids[:first.num_prompt_tokens], first.token_types[:first.num_prompt_tokens], None,
                        first.images, generation_tokens=first.generation_tokens)
        return [first] + [self.choice(request, prompt, params, first.prompt_positions, first.rope_delta, i, pixels)
                          for i in range(1, params.n)]

    def choice(self, request: Request, prompt: Prompt, params: SamplingParams, positions, delta: int, index: int,
               pixels: ImageInputs | None = None) -> Sequence:
        """Choice `index` of a rendered request: its RNG, grammar state, block keys and pixels."""
        cfg, model = self.config, self.model
        seed = None  # greedy: no RNG
        if params.temperature > 0:
            seed = params.seed + index if params.seed is not None else \
                cfg.seed * 1_000_003 + next(self.seed_counter)
        seq = Sequence(request, prompt, params, positions, delta, seed)
        seq.choice_index = index
        if params.structured_outputs is not None:  # compiled here, on the caller's thread, never in the step loop
            seq.matcher = self.grammars().matcher(params.structured_outputs)
        extend_keys(seq, cfg.block_size, cfg.cache_strategy, model.model_id, model.dtype_name)
        seq.vision_keys = self.vision_keys(seq)
        if pixels is not None:
            self.image_inputs[seq] = pixels  # the same pixels: whichever choice the tower runs for first encodes them
        elif prompt.pixel_values is not None:
            self.image_inputs[seq] = ImageInputs(tuple(prompt.images), seq.vision_keys, prompt.pixel_values,
                                                 prompt.pixel_mask)
        return seq

    def grammars(self):
        """The engine's grammar compiler, made on first use (the grammar library is imported only when a request
        asks): xgrammar's where EngineConfig.structured_outputs_backend and the install allow it, else llguidance's."""
        if self._grammars is None:
            from minivlm.engine.sampling.structured_output import GrammarCompiler
            args, backend = (self.model.tokenizer, self.model.text_config.vocab_size), \
                self.config.structured_outputs_backend
            if backend != "guidance" and xgrammar_installed():
                from minivlm.engine.sampling.structured_xgrammar import XGrammarCompiler
                try:
                    self._grammars = XGrammarCompiler(*args)
                except Exception:  # a tokenizer xgrammar cannot read: "auto" serves with llguidance
                    if backend == "xgrammar":
                        raise
            if self._grammars is None:
                self._grammars = GrammarCompiler(*args)
        return self._grammars

    def check_logit_bias(self, params: SamplingParams):
        vocab = self.model.text_config.vocab_size
        bad = [t for t in params.logit_bias or () if t >= vocab]
        if bad:
            raise Refused("invalid_value", "logit_bias names token {token}; the vocabulary has {vocab} tokens",
                          param="logit_bias", token=bad[0], vocab=vocab)

    def vision_keys(self, seq: Sequence) -> tuple[str, ...]:
        """Each image's encoder-cache key, under the request's cache salt: differently salted requests never share
        a tower output (as they never share a KV block), so a hit cannot tell one user what another sent."""
        keys = [im.vision_key(self.model.model_id, self.model.dtype_name) for im in seq.images]
        if seq.cache_salt is None:
            return tuple(keys)
        return tuple(hashlib.sha256(repr((key, seq.cache_salt)).encode()).hexdigest() for key in keys)
