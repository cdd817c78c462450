"""Executes a step plan: frees the encoder outputs the plan frees, encodes its images into the encoder cache, runs
the decoder over the paged KV cache on the plan's flat inputs, then samples one token per sampling request. It reads
no request state: all it needs is in the plan, its encoder cache, the pixels the core handed it on admission and the
sampling state each request's NewRequestData gave its persistent batch (engine/execution/input_batch.py)."""
import torch

from minivlm.model import backends
from minivlm.engine.scheduling.plan import EncodeJob, ScheduledRequest, StepPlan
from minivlm.engine.sampling.sampler import sample, top_logprobs
from minivlm.engine.spec_decode.mtp import MtpProposer
from minivlm.engine.spec_decode.rejection_sampler import verify_request
from minivlm.engine.encoder.encoder_cache import ImageInputs
from minivlm.engine.execution.group_metadata import group_builders, step_metadata
from minivlm.engine.execution.input_batch import InputBatch
from minivlm.engine.encoder.vision_worker import VisionWorker
from minivlm.model.cache_spec import engine_specs

MAX_TOWER_ROWS = 16384  # pixel rows (Qwen's patches, or tiles) in one tower call: bounds its activations


class ModelRunner:
    def __init__(self, model, layer_caches: list, config, vision_worker: VisionWorker | None = None):
        self.decoder, self.vision, self.device = model.decoder, model.vision, model.device
        self.kv_caches = layer_caches  # per layer: (K, V) of its group's pool, or a recurrent layer's state tensors
        self.block_size = config.block_size
        specs = engine_specs(model.decoder, config.speculative_config) or []  # a hybrid model's layers by group
        self.hybrid = bool(specs)  # its decoder reads each group's metadata by kind
        self.encoder_cache: dict[str, tuple] = {}  # vision key -> (embeddings, deepstack features): what the plans keep
        self.inputs: dict[int, ImageInputs] = {}    # seq_id -> its pixels, from admission until its images are taken
        self.vision_worker = vision_worker          # async_vision: the tower's own thread
        self.pending: dict[int, tuple] = {}         # seq_id -> (image indices, Future) of its vision thread's job
        self.batch = InputBatch()                   # each request's sampling state, sent once (engine/execution/input_batch.py)
        self.backend = backends.pick(model, config, self.kv_caches)  # once: how this engine's steps run
        self.builders = group_builders(specs, len(layer_caches), self.block_size, self.backend.attention)  # per group
        self.recurrent = any(b.kind == "recurrent" for b in self.builders)  # states advance in place: no rerun
        self.limits = self.backend.limits  # what the engine needs to know of it, as data
        spec = config.speculative_config  # the MTP head drafts here, after each step (engine/spec_decode/mtp.py)
        if spec is not None and spec.method == "mtp" and getattr(model.decoder, "mtp", None) is None:
            raise ValueError("speculative_config.method 'mtp' needs a model with its own multi-token-prediction "
                             "head (Qwen3.5's mtp.* weights and mtp_num_hidden_layers in its config), loaded with "
                             "that method (an isolated() engine shares a model loaded without it); this one has none")
        self.proposer = MtpProposer(model.decoder, spec.num_speculative_tokens, layer_caches, self.block_size,
                                    lambda seq_id: self.batch[seq_id].block_table) \
            if spec is not None and spec.method == "mtp" and getattr(model.decoder, "mtp", None) is not None else None

    def backend_info(self) -> dict:
        """The backend in words: its attention and decode paths, and the CPU step's timed choice (or "")."""
        return {**self.backend.describe(), "calibration": self.backend.calibration}

    def release(self):
        """Let go of the pool (a backend compiling for it stops first)."""
        self.kv_caches = None
        self.backend.release()

    # ---- encoder outputs: the runner's half of the encoder cache (engine/encoder/encoder_cache.py) ----------------------
    def add_inputs(self, seq_id: int, inputs: ImageInputs):
        """A newly admitted request's pixels, kept until its images are taken (or it leaves). async_vision: its
        images whose outputs are not held go to the vision thread now."""
        self.inputs[seq_id] = inputs
        if self.vision_worker is not None:
            todo = [i for i, key in enumerate(inputs.keys) if key not in self.encoder_cache]
            if todo:
                self.pending[seq_id] = (todo, self.vision_worker.start(*self._pixels(inputs, todo)))

    def update_batch(self, plan: StepPlan):
        """The plan's deltas into the persistent batch: the requests it schedules for the first time (their sampling
        state, kept until remove_request), then every scheduled request's table in each group."""
        for n in plan.new_requests:
            self.batch.add(n)
            if self.proposer is not None:
                self.proposer.add(n.seq_id, n.prompt_token_ids)
        self.batch.update_tables(plan.requests)

    def remove_request(self, seq_id: int):
        """The request left the engine: everything the runner kept of it goes."""
        self.drop_inputs(seq_id)
        self.batch.remove(seq_id)
        if self.proposer is not None:
            self.proposer.remove(seq_id)

    def drop_inputs(self, seq_id: int):
        """The request left the engine: its pixels, and its vision thread's job if any, are dropped."""
        self.inputs.pop(seq_id, None)
        self.pending.pop(seq_id, None)

    def in_tower(self) -> frozenset[int]:
        """async_vision: the requests whose images are still on the vision thread (the scheduler waits for them)."""
        return frozenset(s for s, (_, future) in self.pending.items() if not future.done())

    def wait_for_tower(self, timeout: float):
        """Block until one of the vision thread's jobs finishes, or timeout seconds pass."""
        VisionWorker.wait_any([future for _, future in self.pending.values()], timeout)

    def free_encoder_outputs(self, keys):
        """Delete the outputs the plan frees (evicted by the scheduler's EncoderCacheManager)."""
        for key in keys:
            self.encoder_cache.pop(key, None)

    @staticmethod
    def _pixels(inputs: ImageInputs, todo: list[int]) -> tuple[torch.Tensor, object]:
        """The pixel rows of images `todo` (pixel_values hold every image's rows in order: Qwen's patches or a tiled
        family's tiles) and the layout the tower needs: Qwen's grids, or tiles per image and the pixel mask."""
        images = inputs.images
        offsets = [0] + torch.tensor([im.pixel_rows for im in images]).cumsum(0).tolist()
        rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in todo])
        if images[0].grid_thw is not None:
            return inputs.pixel_values[rows], torch.tensor([images[i].grid_thw for i in todo])
        mask = inputs.pixel_mask[rows] if inputs.pixel_mask is not None else None
        return inputs.pixel_values[rows], ([images[i].pixel_rows for i in todo], mask)

    def encode_images(self, jobs: list[EncodeJob]) -> list[dict | None]:
        """Put each job's `todo` images' outputs into the encoder cache: the vision thread's, where it ran them
        (async_vision), else the tower's right here, one call over every job's images (an output two jobs need runs
        once): the tower's matrix products then have every patch of the step as rows, as HF's batched generate gives
        them, instead of one image's. The jobs' pixels are then dropped (their requests' images are taken). Returns,
        per job, what its vision thread's job took ({num_images, seconds, slices}), or None."""
        cache, wanted, took = self.encoder_cache, {}, []  # wanted: vision key -> (job, image) of the first to want it
        for job in jobs:
            got = None
            if job.seq_id in self.pending:
                done, future = self.pending[job.seq_id]
                outputs, seconds, slices = future.result()  # re-raises the worker's error here, in its step
                for i, value in zip(done, outputs):
                    if i in job.todo:
                        cache.setdefault(job.keys[i], value)
                got = {"num_images": len(done), "seconds": seconds, "slices": slices}
            took.append(got)
            for i in job.todo:
                if job.keys[i] not in cache:
                    wanted.setdefault(job.keys[i], (job, i))
        for batch in self._tower_batches(list(wanted.values())):
            for (job, i), value in zip(batch, self.vision.encode(*self._batch_pixels(batch))):
                cache[job.keys[i]] = value
        for job in jobs:
            self.drop_inputs(job.seq_id)
        return took

    def _tower_batches(self, todo: list[tuple[EncodeJob, int]]) -> list[list[tuple[EncodeJob, int]]]:
        """The (job, image) pairs to encode, in tower calls of at most MAX_TOWER_ROWS pixel rows (an image larger
        than that alone), each call of one layout (Qwen's grids, or tiles of one size with or without a mask)."""
        groups: dict[tuple, list[list]] = {}
        rows_of = lambda job, i: self.inputs[job.seq_id].images[i].pixel_rows  # noqa: E731
        for job, i in todo:
            inputs = self.inputs[job.seq_id]
            kind = (inputs.images[i].grid_thw is not None, inputs.pixel_mask is None,
                    tuple(inputs.pixel_values.shape[1:]))
            batches = groups.setdefault(kind, [[]])
            if batches[-1] and sum(rows_of(*p) for p in batches[-1]) + rows_of(job, i) > MAX_TOWER_ROWS:
                batches.append([])
            batches[-1].append((job, i))
        return [b for batches in groups.values() for b in batches]

    def _batch_pixels(self, batch: list[tuple[EncodeJob, int]]) -> tuple[torch.Tensor, object]:
        """One tower call's pixel rows and layout, from images of several jobs."""
        parts = [self._pixels(self.inputs[job.seq_id], [i]) for job, i in batch]
        pixels = torch.cat([p for p, _ in parts])
        if isinstance(parts[0][1], torch.Tensor):  # Qwen's grids
            return pixels, torch.cat([layout for _, layout in parts])
        masks = [layout[1] for _, layout in parts]
        return pixels, ([n for _, (tiles, _) in parts for n in tiles],
                        torch.cat(masks) if masks[0] is not None else None)

    @torch.inference_mode()
    def forward(self, plan: StepPlan) -> torch.Tensor:
        """Compute K/V for each planned request's tokens [start, end) (a whole prefill, a prefill chunk or one decode
        token); return the next-token logits after each one's last token [B, vocab]. Image placeholders take their
        rows of the encoder cache's outputs, by (vision key, row)."""
        x, dev = plan.build_inputs(), self.device
        input_ids = x.input_ids.to(dev)
        embeds = self.decoder.embed_tokens(input_ids)
        deepstack = None
        if x.image_rows:
            at = x.image_at.to(dev)
            runs = [(self.encoder_cache[key], a, n) for key, a, n in x.image_rows]  # KeyError: an output not held
            embeds[at] = torch.cat([emb[a:a + n] for (emb, _), a, n in runs]).to(embeds.dtype)
            if runs[0][0][1]:
                deepstack = (at, [torch.cat([deep[j][a:a + n] for (_, deep), a, n in runs])
                                  for j in range(len(runs[0][0][1]))])
        meta = step_metadata(self.builders, plan, self.batch, dev, self.hybrid)
        for b in self.builders:
            b.before(plan, self.kv_caches)  # a recurrent state starts from zeros or its checkpoint
        logits = self.backend.forward(self.decoder, embeds, x.positions.to(dev), self.kv_caches, meta, deepstack,
                                      last=x.last.to(dev), input_ids=input_ids)
        for b in self.builders:
            b.after(plan, self.kv_caches)  # states saved into checkpoint slots
        if self.proposer is not None:  # what the MTP head reads after sampling: the same rows, positions, slots
            self.proposer.step = (embeds, x.positions.to(dev), meta["full_attention"] if self.hybrid else meta)
        return logits

    @torch.inference_mode()
    def verify_drafts(self, reqs: list[ScheduledRequest], logits: list[torch.Tensor],
                      masks=None) -> list[list[tuple[int, dict | None]]]:
        """Per speculating request, from its k + 1 rows of logits: the tokens it emits (accepted guesses, then one
        more), each with its logprobs (the model's own at that position, as without speculation); each row shaped by
        its bias, penalties and grammar (masks: the step's, a row after each guess) as its sampling would."""
        out = []
        for r, rows in zip(reqs, logits):
            st = self.batch[r.seq_id]
            tokens = verify_request(rows, r.draft, st, masks)
            lps = torch.log_softmax(rows.float(), dim=-1) if st.params.logprobs is not None else None
            out.append([(t, top_logprobs(lps[j], t, st.params.logprobs) if lps is not None else None)
                        for j, t in enumerate(tokens)])
        for r, emitted in zip(reqs, out):
            self.batch.sampled(r.seq_id, [t for t, _ in emitted])
            for b in self.builders:  # a recurrent state goes back to the one after the last accepted token
                b.accepted(r, len(emitted) - 1, self.kv_caches)
        return out

    @torch.inference_mode()
    def sample_tokens(self, reqs: list[ScheduledRequest], logits: torch.Tensor,
                      masks=None) -> list[tuple[int, dict | None]]:
        """(next token, {token: logprob} or None) per request [B rows of logits], by its SamplingParams and RNG (its
        state in the batch), within its grammar's mask (masks: the step's, filled) if it has one."""
        states = [self.batch[r.seq_id] for r in reqs]
        tokens, logprobs = sample(logits, [s.params for s in states], [s.generator for s in states], states, masks)
        out = [(tok, top_logprobs(logprobs[i], tok, s.params.logprobs) if s.params.logprobs is not None else None)
               for i, (s, tok) in enumerate(zip(states, tokens))]
        for r, tok in zip(reqs, tokens):
            self.batch.sampled(r.seq_id, [tok])
        return out
