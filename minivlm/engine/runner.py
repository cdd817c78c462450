"""Executes a step plan: the vision tower for the plan's images, the decoder over the paged KV cache on the plan's
flat inputs, then one token per sampling request. It reads no request state: all it needs is in the plan."""
import torch

from minivlm.model.attention import AttentionMetadata
from minivlm.engine.plan import EncodeJob, ScheduledRequest, StepPlan
from minivlm.engine.sampler import sample, top_logprobs
from minivlm.engine.vision_cache import VisionCache


class ModelRunner:
    def __init__(self, model, kv_cache: torch.Tensor, block_size: int, vision_cache: VisionCache,
                 eager: bool = False):
        self.decoder, self.vision, self.device = model.decoder, model.vision, model.device
        self.eager = eager  # EngineConfig.enforce_eager: the decoder's PyTorch-ops path only
        self.kv_caches = [(kv_cache[0, i], kv_cache[1, i]) for i in range(kv_cache.shape[1])]
        self.block_size = block_size
        self.vision_cache = vision_cache

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

    def encode_images(self, job: EncodeJob) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A request's vision embeddings and deepstack features: from the vision worker's finished job, from the
        vision cache (images seen before), or from the tower right here."""
        results = [self.vision_cache.get(k) for k in job.keys]  # None where the tower has to run
        fresh = {}  # image index -> the tower's output, this request's new cache entries
        if job.pending is not None:
            done, future = job.pending
            fresh.update(zip(done, future.result()[0]))  # re-raises the worker's error here, in this request's step
        todo = [i for i, r in enumerate(results) if r is None and i not in fresh]
        if todo:
            fresh.update(zip(todo, self.vision.encode(*self._pixels(job.images, job.pixel_values, job.pixel_mask,
                                                                    todo))))
        for i, value in fresh.items():
            results[i] = value
            self.vision_cache.put(job.keys[i], value)
        return torch.cat([r[0] for r in results]), [torch.cat([r[1][j] for r in results])
                                                    for j in range(len(results[0][1]))]

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
                                       self.block_size, dev)
        hidden = self.decoder(embeds, x.positions.to(dev), self.kv_caches, meta, deepstack, eager=self.eager)
        return self.decoder.compute_logits(hidden[x.last.to(dev)])

    @staticmethod
    @torch.inference_mode()
    def sample_tokens(reqs: list[ScheduledRequest], logits: torch.Tensor) -> list[tuple[int, dict | None]]:
        """(next token, {token: logprob} or None) per request [B rows of logits], by its SamplingParams and RNG."""
        tokens, logprobs = sample(logits, [r.params for r in reqs], [r.generator for r in reqs])
        return [(tok, top_logprobs(logprobs[i], tok, r.params.logprobs) if r.params.logprobs is not None else None)
                for i, (r, tok) in enumerate(zip(reqs, tokens))]
