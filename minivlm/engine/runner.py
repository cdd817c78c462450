"""Executes a step plan: the vision tower for the plan's images, the decoder over the paged KV cache on the plan's
flat inputs, then one token per sampling request. It reads no request state: all it needs is in the plan."""
import torch

from minivlm.model import backends
from minivlm.model.attention import AttentionMetadata
from minivlm.engine.plan import EncodeJob, ScheduledRequest, StepPlan
from minivlm.engine.sampler import sample, top_logprobs
from minivlm.engine.vision_cache import VisionCache

MAX_TOWER_ROWS = 16384  # pixel rows (Qwen's patches, or tiles) in one tower call: bounds its activations


class ModelRunner:
    def __init__(self, model, kv_cache: torch.Tensor, config, vision_cache: VisionCache):
        self.decoder, self.vision, self.device = model.decoder, model.vision, model.device
        self.kv_caches = [(kv_cache[0, i], kv_cache[1, i]) for i in range(kv_cache.shape[1])]
        self.block_size = config.block_size
        self.vision_cache = vision_cache
        self.backend = backends.pick(model, config, self.kv_caches)  # once: how this engine's steps run
        self.limits = self.backend.limits  # what the engine needs to know of it, as data

    def release(self):
        """Let go of the pool (a backend compiling for it stops first)."""
        self.kv_caches = None
        self.backend.release()

    @staticmethod
    def _pixels(images, pixel_values, pixel_mask, todo: list[int]) -> tuple[torch.Tensor, object]:
        """The pixel rows of images `todo` (pixel_values hold every image's rows in order: Qwen's patches or a tiled
        family's tiles) and the layout the tower needs: Qwen's grids, or tiles per image and the pixel mask."""
        offsets = [0] + torch.tensor([im.pixel_rows for im in images]).cumsum(0).tolist()
        rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in todo])
        if images[0].grid_thw is not None:
            return pixel_values[rows], torch.tensor([images[i].grid_thw for i in todo])
        mask = pixel_mask[rows] if pixel_mask is not None else None
        return pixel_values[rows], ([images[i].pixel_rows for i in todo], mask)

    def start_encoding(self, seq, worker):
        """async_vision: hand seq's uncached images to the vision worker as soon as the request arrives."""
        if seq.pixel_values is None or seq.image_embeds is not None or seq.vision_job is not None:
            return
        todo = [i for i, k in enumerate(seq.vision_keys) if k not in self.vision_cache]  # a peek: no hit counted
        if todo:
            worker.start(seq, todo, *self._pixels(seq.images, seq.pixel_values, seq.pixel_mask, todo))

    def encode_images(self, jobs: list[EncodeJob]) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Each job's vision embeddings and deepstack features: from the vision worker's finished job, from the
        vision cache (images seen before), or from the tower right here, one call over every job's other images
        (an image two jobs share runs once): the tower's matrix products then have every patch of the step as
        rows, as HF's batched generate gives them, instead of one image's."""
        results, wanted = [], {}  # per job, per image: its value or None; vision key -> [(job, image)] without one
        for j, job in enumerate(jobs):
            got = [self.vision_cache.get(k) for k in job.keys]
            if job.pending is not None:
                done, future = job.pending
                for i, value in zip(done, future.result()[0]):  # re-raises the worker's error here, in its step
                    got[i] = value
                    self.vision_cache.put(job.keys[i], value)
            for i, value in enumerate(got):
                if value is None:
                    wanted.setdefault(job.keys[i], []).append((j, i))
            results.append(got)
        for batch in self._tower_batches(jobs, [places[0] for places in wanted.values()]):
            for (j, i), value in zip(batch, self.vision.encode(*self._batch_pixels(jobs, batch))):
                self.vision_cache.put(jobs[j].keys[i], value)
                for jj, ii in wanted[jobs[j].keys[i]]:
                    results[jj][ii] = value
        return [(torch.cat([r[0] for r in got]), [torch.cat([r[1][d] for r in got]) for d in range(len(got[0][1]))])
                for got in results]

    @staticmethod
    def _tower_batches(jobs: list[EncodeJob], todo: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        """The (job, image) pairs to encode, in tower calls of at most MAX_TOWER_ROWS pixel rows (an image larger
        than that alone), each call of one layout (Qwen's grids, or tiles of one size with or without a mask)."""
        groups: dict[tuple, list[list]] = {}
        for j, i in todo:
            job = jobs[j]
            kind = (job.images[i].grid_thw is not None, job.pixel_mask is None, tuple(job.pixel_values.shape[1:]))
            batches = groups.setdefault(kind, [[]])
            rows = job.images[i].pixel_rows
            if batches[-1] and sum(jobs[b].images[c].pixel_rows for b, c in batches[-1]) + rows > MAX_TOWER_ROWS:
                batches.append([])
            batches[-1].append((j, i))
        return [b for batches in groups.values() for b in batches]

    def _batch_pixels(self, jobs: list[EncodeJob], batch: list[tuple[int, int]]) -> tuple[torch.Tensor, object]:
        """One tower call's pixel rows and layout, from images of several jobs."""
        parts = [self._pixels(jobs[j].images, jobs[j].pixel_values, jobs[j].pixel_mask, [i]) for j, i in batch]
        pixels = torch.cat([p for p, _ in parts])
        if isinstance(parts[0][1], torch.Tensor):  # Qwen's grids
            return pixels, torch.cat([layout for _, layout in parts])
        masks = [layout[1] for _, layout in parts]
        return pixels, ([n for _, (tiles, _) in parts for n in tiles],
                        torch.cat(masks) if masks[0] is not None else None)

    @torch.inference_mode()
    def forward(self, plan: StepPlan, images: dict | None = None) -> torch.Tensor:
        """Compute K/V for each planned request's tokens [start, end) (a whole prefill, a prefill chunk or one decode
        token); return the next-token logits after each one's last token [B, vocab]. images: seq_id -> (image
        embeddings, deepstack) of the requests whose tokens include image placeholders."""
        x, dev = plan.inputs, self.device
        embeds = self.decoder.embed_tokens(x.input_ids.to(dev))
        deepstack = None
        if x.image_owner:
            at = x.image_at.to(dev)
            owners = [(images[plan.requests[n].seq_id], rows.to(dev)) for n, rows in x.image_owner]
            embeds[at] = torch.cat([emb[rows] for (emb, _), rows in owners]).to(embeds.dtype)
            if owners[0][0][1]:
                deepstack = (at, [torch.cat([deep[j][rows] for (_, deep), rows in owners])
                                  for j in range(len(owners[0][0][1]))])
        meta = AttentionMetadata.build(x.slot_mapping.to(dev), x.q_lens, x.ctx_lens, x.block_tables.to(dev),
                                       self.block_size, dev, self.backend.attention)
        return self.backend.forward(self.decoder, embeds, x.positions.to(dev), self.kv_caches, meta, deepstack,
                                    last=x.last.to(dev))

    @staticmethod
    @torch.inference_mode()
    def sample_tokens(reqs: list[ScheduledRequest], logits: torch.Tensor) -> list[tuple[int, dict | None]]:
        """(next token, {token: logprob} or None) per request [B rows of logits], by its SamplingParams and RNG."""
        tokens, logprobs = sample(logits, [r.params for r in reqs], [r.generator for r in reqs])
        return [(tok, top_logprobs(logprobs[i], tok, r.params.logprobs) if r.params.logprobs is not None else None)
                for i, (r, tok) in enumerate(zip(reqs, tokens))]
