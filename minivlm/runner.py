"""One forward step: turn scheduled sequences into flat tensors (tokens, M-RoPE positions, slots, block
tables, image embeddings), run the decoder over the paged KV cache; then sample one token per sequence."""
import torch

from minivlm.model.attention import AttentionMetadata
from minivlm.sampler import sample, top_logprobs
from minivlm.vision_cache import VisionCache


class ModelRunner:
    def __init__(self, model, kv_cache: torch.Tensor, block_size: int, vision_cache: VisionCache):
        self.decoder, self.vision, self.device = model.decoder, model.vision, model.device
        self.kv_caches = [(kv_cache[0, i], kv_cache[1, i]) for i in range(kv_cache.shape[1])]
        self.block_size = block_size
        self.vision_cache = vision_cache
        self.model_id, self.dtype_name = model.model_id, model.dtype_name

    def _keys(self, seq) -> list[str]:
        """Each image's vision-cache key."""
        return [im.vision_key(self.model_id, self.dtype_name) for im in seq.images]

    def _pixels(self, seq, todo: list[int]) -> tuple[torch.Tensor, object]:
        """The pixel rows of images `todo` of seq (its pixel_values hold every image's rows in order: Qwen's patches or
        a tiled family's tiles) and the layout the tower needs: Qwen's grids, or tiles per image and the pixel mask."""
        offsets = [0] + torch.tensor([im.pixel_rows for im in seq.images]).cumsum(0).tolist()
        rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in todo])
        if seq.images[0].grid_thw is not None:
            return seq.pixel_values[rows], torch.tensor([seq.images[i].grid_thw for i in todo])
        mask = seq.pixel_mask[rows] if seq.pixel_mask is not None else None
        return seq.pixel_values[rows], ([seq.images[i].pixel_rows for i in todo], mask)

    def start_encoding(self, seq, worker):
        """async_vision: hand seq's uncached images to the vision worker as soon as the request arrives."""
        if seq.pixel_values is None or seq.image_embeds is not None or seq.vision_job is not None:
            return
        todo = [i for i, k in enumerate(self._keys(seq)) if k not in self.vision_cache]  # a peek: no hit counted
        if todo:
            worker.start(seq, todo, *self._pixels(seq, todo))

    def encode_images(self, seq):
        """Vision embeddings of seq's images, once per request: from the vision worker's finished job, from the
        vision cache (images seen before), or from the tower right here."""
        if seq.pixel_values is None or seq.image_embeds is not None:
            return
        keys = self._keys(seq)
        results = [self.vision_cache.get(k) for k in keys]  # None where the tower has to run
        fresh = {}  # image index -> the tower's output, this request's new cache entries
        if seq.vision_job is not None:
            done, job = seq.vision_job
            seq.vision_job = None
            fresh.update(zip(done, job.result()[0]))  # re-raises the worker's error here, in this request's step
        todo = [i for i, r in enumerate(results) if r is None and i not in fresh]
        if todo:
            fresh.update(zip(todo, self.vision.encode(*self._pixels(seq, todo))))
        for i, value in fresh.items():
            results[i] = value
            self.vision_cache.put(keys[i], value)
        seq.image_embeds = torch.cat([r[0] for r in results])
        seq.deepstack = [torch.cat([r[1][j] for r in results]) for j in range(len(results[0][1]))]
        seq.pixel_values = seq.pixel_mask = None  # the pixels are not needed any more

    def slots(self, seq, start: int, end: int) -> torch.Tensor:
        idx = torch.arange(start, end)
        table = torch.tensor(seq.block_table)
        return table[idx // self.block_size] * self.block_size + idx % self.block_size

    def encode_step_images(self, seqs: list) -> list[None]:
        """The vision tower for the requests whose tokens this step include image placeholders."""
        for seq in seqs:
            if self.has_images_to_compute(seq):
                self.encode_images(seq)
        return [None] * len(seqs)

    @staticmethod
    def has_images_to_compute(seq) -> bool:
        """Whether this step's tokens of seq [num_computed, chunk_end) include image placeholders."""
        return seq.num_computed < seq.num_prompt_tokens and any(seq.token_types[seq.num_computed:seq.chunk_end])

    @torch.inference_mode()
    def forward(self, seqs: list) -> torch.Tensor:
        """Compute K/V for each sequence's tokens [num_computed, chunk_end) (a whole prefill, a prefill chunk or
        one decode token); return the next-token logits after each one's last computed token [B, vocab]."""
        ids, positions, slots, q_lens, ctx_lens = [], [], [], [], []
        image_at, image_rows, seq_of_image = [], [], []
        offset = 0
        for n, seq in enumerate(seqs):
            start, end = seq.num_computed, seq.chunk_end
            ids.append(torch.tensor(seq.token_ids[start:end]))
            positions.append(seq.positions(start, end))
            slots.append(self.slots(seq, start, end))
            q_lens.append(end - start)
            ctx_lens.append(end)
            if self.has_images_to_compute(seq):  # a prefix-cache hit or an earlier chunk may cover them all
                local = torch.nonzero(torch.tensor(seq.token_types[start:end]) == 1).flatten()
                self.encode_images(seq)  # once per request; each chunk takes its rows
                image_at.append(local + offset)
                image_rows.append(seq.image_rank[start:end][local])
                seq_of_image.append(n)
            offset += end - start
        dev = self.device
        embeds = self.decoder.embed_tokens(torch.cat(ids).to(dev))
        deepstack = None
        if image_at:
            at = torch.cat(image_at).to(dev)
            feats = torch.cat([seqs[n].image_embeds[r.to(dev)] for n, r in zip(seq_of_image, image_rows)])
            embeds[at] = feats.to(embeds.dtype)
            if seqs[seq_of_image[0]].deepstack:
                layers = len(seqs[seq_of_image[0]].deepstack)
                deepstack = (at, [torch.cat([seqs[n].deepstack[j][r.to(dev)] for n, r in zip(seq_of_image, image_rows)])
                                  for j in range(layers)])
        max_blocks = max(len(s.block_table) for s in seqs)
        tables = torch.tensor([s.block_table + [0] * (max_blocks - len(s.block_table)) for s in seqs])
        meta = AttentionMetadata.build(torch.cat(slots).to(dev), q_lens, ctx_lens, tables.to(dev), self.block_size, dev)
        hidden = self.decoder(embeds, torch.cat(positions, dim=1).to(dev), self.kv_caches, meta, deepstack)
        last = torch.tensor(q_lens).cumsum(0) - 1
        return self.decoder.compute_logits(hidden[last.to(dev)])

    @staticmethod
    @torch.inference_mode()
    def sample_tokens(seqs: list, logits: torch.Tensor) -> list[tuple[int, dict | None]]:
        """(next token, {token: logprob} or None) per sequence, by its SamplingParams and generator."""
        tokens, logprobs = sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        out = []
        for i, (seq, tok) in enumerate(zip(seqs, tokens)):
            k = seq.params.logprobs
            out.append((tok, top_logprobs(logprobs[i], tok, k) if k is not None else None))
        return out
