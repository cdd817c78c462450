"""Train the tiny Qwen3-VL on synthetic shape scenes generated on the fly (seeded, resumable).

    nice -n 10 python -m tools.train_tiny --out runs/tiny --steps 8000
    nice -n 10 python -m tools.train_tiny --init assets/tiny-qwen-vl --out runs/describe --steps 1300

The first trains from scratch on the five one-word question types; the second fine-tunes a trained checkpoint on
descriptions and positions as well (stage 1 and stage 2 of the shipped weights: every invocation is in
assets/tiny-qwen-vl/README.md; the auxiliary losses are in tools/train_signals.py). Every batch is a pure function of (seed, step), so a run resumed
from its checkpoint sees the same data as an uninterrupted one. The loss covers only the assistant answers and
their <|im_end|>.
"""
import argparse
import json
import math
import os
import random
import time

import torch
from transformers import Qwen3VLForConditionalGeneration

from minivlm.inputs.processor import load_processor
from tools.make_checkpoint import save_processor, tiny_config
from tools.scenes import (COLORS, QUESTION_TYPES, SHAPES, ask, possible_types, question, random_scene, render,
                          sample)
from tools.tiny_tokenizer import build_tokenizer, extend_tokenizer, zh_tokens
from tools.train_signals import losses_of, token_labels, where_queries

FAMILY = "qwen3_vl"
PATCH, MIN_PIXELS, MAX_PIXELS = 8, 112 * 112, 128 * 128  # merged token = 16 px; images ~112-128 px a side
MODEL = dict(hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, intermediate=384,
             vision_depth=4, vision_hidden=128, vision_heads=4)
DEEPSTACK = [1, 2]
# shape questions are the hard part, so they are asked most
TYPE_WEIGHTS = {"color": 1.0, "shape": 3.0, "count": 1.5, "color_of": 2.5, "is_there": 2.5}
# once colour, shape and count are learned, binding a colour to a shape (the last two) is what is left
FOCUS_WEIGHTS = {"color": 0.5, "shape": 1.0, "count": 0.5, "color_of": 3.0, "is_there": 4.0}
# is_there then still ignores the colour: ask it most, with "no" mostly for a present shape in another colour
BIND_WEIGHTS = {"color": 0.3, "shape": 0.5, "count": 0.3, "color_of": 1.5, "is_there": 6.0}
# fine-tuning a trained model (--init) on descriptions and positions, replaying the five one-word types
DESCRIBE_WEIGHTS = {"color": 0.3, "shape": 0.5, "count": 0.5, "color_of": 1.0, "is_there": 2.0, "describe": 4.0,
                    "where": 3.0}
# then precision near the thirds cuts is what is left: ask where (one position per answer) most
PRECISION_WEIGHTS = {"color": 0.3, "shape": 0.5, "count": 0.5, "color_of": 1.0, "is_there": 1.5, "describe": 4.0,
                     "where": 5.0}
# stage 3 (--zh): every type in both languages, the Chinese forms new, so each asked about as often as it is hard
ZH_WEIGHTS = {"color": 1.0, "shape": 1.0, "count": 1.0, "color_of": 1.5, "is_there": 2.0, "describe": 3.0,
              "where": 3.0}
# a new Chinese token's embedding starts as the mean of these English texts' tokens (the embedding is tied, so
# the answer word starts as likely as its English twin and the fine-tune only has to learn which language)
ZH_INIT = {"红色": ["red", " red"], "绿色": ["green", " green"], "蓝色": ["blue", " blue"], "黄色": ["yellow", " yellow"],
           "紫色": ["purple", " purple"], "橙色": ["orange", " orange"], "圆形": ["circle", " circle"],
           "正方形": ["square", " square"], "三角形": ["triangle", " triangle"], "一个": ["one"], "两个": ["two"],
           "三个": ["three"], "有": ["yes"], "没有": ["no"], "左上": ["top left"], "上方": ["top center"],
           "右上": ["top right"], "左侧": ["middle left"], "中间": ["center"], "右侧": ["middle right"],
           "左下": ["bottom left"], "下方": ["bottom center"], "右下": ["bottom right"], "在": [" at the"],
           "，": [" and"], "？": ["?"], "。": ["."], "这个": [" the shape"], "形状": [" shape"], "是": [" is"],
           "什么": ["What"], "颜色": [" color"], "这是": [" it"], "图中": [" there"], "几个": ["How many"],
           "哪里": ["Where"], "描述": ["Describe"], "这张": [" the"], "图片": [" picture"], "的": [" a"], "吗": ["Is"]}
NEAR = 0.05  # a centre this close to a thirds cut (fraction of the canvas) is "near a cut"


def weights_at(step: int, args) -> dict:
    """The question-type mixture of this step."""
    if getattr(args, "type_weights", None):  # a later stage's own mixture (tools/train_tiny_qwen3_5 --type-weights)
        return args.type_weights
    if args.zh or args.zh_mixed:
        return ZH_WEIGHTS
    if args.init:
        return PRECISION_WEIGHTS if args.near_cut else DESCRIBE_WEIGHTS
    return BIND_WEIGHTS if step >= args.bind_from else FOCUS_WEIGHTS if step >= args.focus_from else TYPE_WEIGHTS


def build_model(seed: int, init: str = None, zh: bool = False):
    """Tokenizer and model of the tiny Qwen3-VL: freshly initialised, or the trained checkpoint `init` with the
    position words added to its tokenizer (each new embedding row starts as the mean of the word's old pieces)
    and, with `zh`, the Chinese tokens (rows from ZH_INIT's English words; a character from the first word that
    holds it; the byte pairs between, the old rows' mean)."""
    torch.manual_seed(seed)
    if init is None:
        tokenizer = build_tokenizer()
        config = tiny_config(FAMILY, tokenizer, patch_size=PATCH, **MODEL)
        config.vision_config.deepstack_visual_indexes = DEEPSTACK
        return tokenizer, Qwen3VLForConditionalGeneration(config)
    old = load_processor(init, FAMILY).tokenizer
    tokenizer = extend_tokenizer(old)
    if zh:
        tokenizer = extend_tokenizer(tokenizer, zh_tokens())
    model = Qwen3VLForConditionalGeneration.from_pretrained(init, dtype=torch.float32)
    n_old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        mean = emb[:n_old].mean(0)
        for i in range(n_old, len(tokenizer)):
            word = tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(i)])
            if zh and not word.isascii():  # a Chinese word, character, or a byte pair inside one
                source = ZH_INIT.get(word) or next((ZH_INIT[w] for w in ZH_INIT if word in w), None)
                emb[i] = torch.stack([emb[old(t).input_ids].mean(0) for t in source]).mean(0) if source else mean
            else:
                emb[i] = emb[old(word).input_ids].mean(0)
    return tokenizer, model


def export(model, tokenizer, out_dir: str):
    """Write an HF-format checkpoint dir: config, safetensors, tokenizer, processor, chat template."""
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    save_processor(out_dir, FAMILY, tokenizer, PATCH, MIN_PIXELS, MAX_PIXELS)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": model.config.text_config.eos_token_id,
                   "pad_token_id": model.config.text_config.pad_token_id, "do_sample": False}, f)


def cut_distance(shape, scene) -> float:
    """How far the shape's box centre lies from the nearest thirds cut, either axis, as a fraction of the canvas."""
    cx, cy = (shape.x + shape.side / 2) / scene.width, (shape.y + shape.side / 2) / scene.height
    return min(abs(c - cut) for c in (cx, cy) for cut in (1 / 3, 2 / 3))


def conversation(rng: random.Random, step: int, args):
    """One training chat: an image, 1-3 question/answer turns about it (single-shape scenes first), and the
    (turn, shape index, colour index) of each "where" question in it."""
    early = step < args.curriculum_steps and not args.init
    num = 1 if early or rng.random() < 0.35 else rng.randint(2, 3)
    if args.init:  # one shape first (positions without binding), then mostly three (the longest answers)
        one = 0.25 + 0.45 * max(0.0, 1 - step / args.shapes_ramp) if args.shapes_ramp else 0.25
        num = rng.choices([1, 2, 3], [one, 0.35 / 0.75 * (1 - one), 0.4 / 0.75 * (1 - one)])[0]
    kinds = None
    if args.kind_twins and num > 1 and rng.random() < args.kind_twins:  # two shapes of one kind: only colour tells
        twin = rng.choice(SHAPES)
        kinds = rng.sample([twin, twin] + [rng.choice(SHAPES) for _ in range(num - 2)], num)
    scene = random_scene(rng, num, kinds, size=(0.3, 0.7) if early else (0.25, 0.45))  # big shapes show shape first
    if args.near_cut and rng.random() < args.near_cut:  # a scene drawn from the same spec, kept if a shape is near a cut
        while min(cut_distance(s, scene) for s in scene.shapes) >= NEAR:
            scene = random_scene(rng, num, kinds)
    types = possible_types(scene)
    table = weights_at(step, args)
    weights = [table.get(t, 0.0) for t in types]
    hard = (0.1, 0.9) if step >= args.bind_from or args.init else (0.4, 0.8)
    turns = rng.choice([2, 3, 4] if args.init else [1, 1, 2, 3])  # fine-tuning: more answers per image
    lang, r = "en", rng.random() if args.zh or args.zh_mixed else 1.0  # (no draw: older flags' data unchanged)
    if r < args.zh:
        lang = "zh"  # the whole chat in Chinese
    elif r < args.zh + args.zh_mixed:
        lang = None  # each turn's language drawn: mixed chats
    messages, asked = [], []
    for i in range(turns):
        turn_lang = lang or rng.choice(["en", "zh"])
        text, answer = ask(scene, rng.choices(types, weights)[0], rng, hard, turn_lang)
        content = [{"type": "image"}, {"type": "text", "text": text}] if i == 0 else text
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]
        asked += [(i, k, list(COLORS).index(sh.color)) for k, sh in enumerate(scene.shapes)
                  if text == question("where", turn_lang, sh.color, sh.kind)]
    return scene, render(scene, supersample=rng.choice([1, 2])), messages, asked


def answer_labels(input_ids: torch.Tensor, prefix: list, end_id: int) -> torch.Tensor:
    """Labels that keep only tokens after each assistant prefix, up to and including <|im_end|>."""
    labels = torch.full_like(input_ids, -100)
    for b, row in enumerate(input_ids.tolist()):
        i, k = 0, len(prefix)
        while i <= len(row) - k:
            if row[i:i + k] == prefix:
                j = i + k
                while j < len(row) and row[j] != end_id:
                    j += 1
                labels[b, i + k:j + 1] = input_ids[b, i + k:j + 1]
                i = j
            i += 1
    return labels


def make_batch(processor, step: int, args):
    """A padded processor batch with answer-only labels, per-vision-token labels and the "where" answers'
    queries (train_signals), a pure function of (seed, step)."""
    rng = random.Random(args.seed * 1_000_003 + step)
    scenes, images, texts, asked = [], [], [], []
    for _ in range(args.batch_size):
        scene, image, messages, where = conversation(rng, step, args)
        scenes.append(scene)
        images.append(image)
        asked.append(where)
        texts.append(processor.apply_chat_template(messages, tokenize=False))
    batch = processor(text=texts, images=images, padding=True, return_tensors="pt")
    tok = processor.tokenizer
    prefix = tok("<|im_start|>assistant\n").input_ids
    batch["labels"] = answer_labels(batch["input_ids"], prefix, tok.convert_tokens_to_ids("<|im_end|>"))
    return batch, torch.cat([token_labels(sc, g, PATCH) for sc, g in zip(scenes, batch["image_grid_thw"])]), \
        where_queries(batch["input_ids"], prefix, asked)


PROBE_ROWS = [(q, None) for q in QUESTION_TYPES if q != "describe"] + [("describe", n) for n in (1, 2, 3)]
VALID_SEED = 10**9  # the probe's validation stream (eval_tiny --split valid draws from another one)


@torch.no_grad()
def probe(model, processor, per_type: int = 30, device: str = "cpu", langs=("en",)):
    """Teacher-forced exact match per question type on fixed validation scenes: every answer token and the
    closing <|im_end|> must be the argmax, which is exactly when greedy decoding returns the true answer
    (Chinese rows, named zh_{type}, ask the English rows' scenes in Chinese)."""
    model.eval()
    acc, tok = {}, processor.tokenizer
    prefix, end_id = tok("<|im_start|>assistant\n").input_ids, tok.convert_tokens_to_ids("<|im_end|>")
    for lang, (row, (qtype, num)) in ((lang, r) for lang in langs for r in enumerate(PROBE_ROWS)):
        items = [sample(VALID_SEED + 1000 * row + i, qtype, num, lang) for i in range(per_type)]
        texts = [processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {
            "type": "text", "text": q}]}, {"role": "assistant", "content": a}], tokenize=False)
            for _, q, a, _ in items]
        batch = processor(text=texts, images=[im for im, _, _, _ in items], padding=True, return_tensors="pt")
        batch = batch.to(device)
        labels = answer_labels(batch["input_ids"].cpu(), prefix, end_id)[:, 1:].to(device)
        hit = (model(**batch).logits[:, :-1].argmax(-1) == labels) | (labels == -100)
        name = qtype if num is None else f"{qtype}_{num}"
        acc[name if lang == "en" else f"{lang}_{name}"] = hit.all(-1).float().mean().item()
    model.train()
    return acc


class StepBatches(torch.utils.data.Dataset):
    """Batches of steps start..stop-1, so DataLoader workers can build them ahead (each a pure function of
    (seed, step), whichever worker builds it)."""

    def __init__(self, processor, args, start: int, stop: int):
        self.processor, self.args, self.start, self.stop = processor, args, start, stop

    def __len__(self):
        return max(0, self.stop - self.start)

    def __getitem__(self, i):
        return make_batch(self.processor, self.start + i, self.args)


def lr_scale(step: int, warmup: int, total: int) -> float:
    """Linear warmup, then cosine decay to 10 %."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/tiny")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--vision-lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--curriculum-steps", type=int, default=800)
    p.add_argument("--focus-from", type=int, default=3300, help="step from which FOCUS_WEIGHTS apply")
    p.add_argument("--bind-from", type=int, default=8000, help="step from which BIND_WEIGHTS apply")
    p.add_argument("--stop-at", type=int, default=None, help="stop (with a checkpoint) before --steps")
    p.add_argument("--aux-weight", type=float, default=0.5)
    p.add_argument("--init", default=None, help="fine-tune this trained checkpoint on DESCRIBE_WEIGHTS")
    p.add_argument("--shapes-ramp", type=int, default=0,
                   help="with --init: one-shape scenes fall from 70 %% to 25 %% of chats over this many steps")
    p.add_argument("--position-weight", type=float, default=10.0, help="aux loss on positions (with --init)")
    p.add_argument("--near-cut", type=float, default=0.0,
                   help=f"with --init: this share of chats keeps only scenes with a shape centre within {NEAR} of a "
                        "thirds cut, and the mixture asks where most (PRECISION_WEIGHTS)")
    p.add_argument("--kind-twins", type=float, default=0.0,
                   help="with --init: this share of 2-3-shape chats has two shapes of one kind (where must bind colour)")
    p.add_argument("--third-weight", type=float, default=0.0,
                   help="aux CE on the row/column third of each in-shape vision token's shape centre")
    p.add_argument("--attend-weight", type=float, default=0.0,
                   help="aux loss: a where answer's attention (one layer, mean over heads) on its shape's tokens")
    p.add_argument("--query-weight", type=float, default=0.0,
                   help="aux CE: the asked shape's colour, read from the input of --attend-layer at a where answer")
    p.add_argument("--attend-layer", type=int, default=2, help="the decoder layer --attend-weight supervises")
    p.add_argument("--zh", type=float, default=0.0,
                   help="with --init: this share of chats is asked in Chinese (stage 3; adds the Chinese tokens)")
    p.add_argument("--zh-mixed", type=float, default=0.0,
                   help="with --init: this share of chats draws each turn's language (English or Chinese)")
    p.add_argument("--freeze-vision", action="store_true",
                   help="train the decoder only (the vision tower, and what it sees, stay exactly as they were)")
    p.add_argument("--probe-per-type", type=int, default=30)
    p.add_argument("--init-aux", default=None, help="a training checkpoint (ckpt.pt) whose auxiliary heads to start from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-every-s", type=float, default=180)
    p.add_argument("--probe-every", type=int, default=150)
    p.add_argument("--device", default="cpu", help="e.g. cuda: the batches are the same, only the arithmetic moves")
    p.add_argument("--workers", type=int, default=0, help="processes building batches ahead (0: in the loop)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    zh = bool(args.zh or args.zh_mixed)
    tokenizer, model = build_model(args.seed, args.init, zh)
    if args.freeze_vision:  # no gradient reaches the vision tower: its outputs stay exactly the shipped ones
        model.model.visual.requires_grad_(False)
    export(model, tokenizer, os.path.join(args.out, "init"))
    processor = load_processor(os.path.join(args.out, "init"), FAMILY)
    processor.tokenizer.padding_side = "right"
    captured = {}
    model.model.visual.register_forward_hook(lambda m, i, out: captured.update(tokens=out.pooler_output))
    if args.attend_weight:  # eager attention returns its weights; the hook keeps one layer's
        model.config.text_config._attn_implementation = "eager"
        model.model.language_model.layers[args.attend_layer].self_attn.register_forward_hook(
            lambda m, i, out: captured.update(attention=out[1]))
    if args.query_weight:  # what the supervised layer's queries are computed from
        model.model.language_model.layers[args.attend_layer].register_forward_pre_hook(
            lambda m, args_, kwargs: captured.update(query_input=kwargs.get("hidden_states", args_[0] if args_ else None)),
            with_kwargs=True)
    hidden = model.config.text_config.hidden_size
    aux_head = torch.nn.ModuleDict({"kind": torch.nn.Linear(hidden, len(SHAPES) + 1),
                                    "position": torch.nn.Linear(hidden, 4)})
    if args.third_weight:
        aux_head["third"] = torch.nn.Linear(hidden, 6)
    if args.query_weight:
        aux_head["asked_color"] = torch.nn.Linear(hidden, len(COLORS))
    if args.init_aux:  # heads missing from an older checkpoint (third) keep their fresh initialisation
        aux_head.load_state_dict(torch.load(args.init_aux, weights_only=False, map_location="cpu")["aux_head"],
                                 strict=False)
    model.to(args.device)
    aux_head.to(args.device)
    vision = [p for n, p in model.named_parameters() if ".visual." in f".{n}"] + list(aux_head.parameters())
    text = [p for n, p in model.named_parameters() if ".visual." not in f".{n}"]
    opt = torch.optim.AdamW([{"params": vision, "lr": args.vision_lr}, {"params": text, "lr": args.lr}],
                            weight_decay=0.01, betas=(0.9, 0.98))
    base_lrs = [args.vision_lr, args.lr]
    ckpt_path, step, best = os.path.join(args.out, "ckpt.pt"), 0, -1.0
    if os.path.exists(ckpt_path):
        state = torch.load(ckpt_path, weights_only=False, map_location=args.device)
        model.load_state_dict(state["model"])
        aux_head.load_state_dict(state["aux_head"])
        opt.load_state_dict(state["opt"])
        step, best = state["step"], state["best"]
        print(f"resumed at step {step}", flush=True)
    n_vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    print(f"params {sum(p.numel() for p in model.parameters()):,} (vision {n_vision:,})",
          flush=True)
    model.train()
    last_save, t0, losses = time.time(), time.time(), []
    stop = min(args.stop_at or args.steps, args.steps)
    batches = torch.utils.data.DataLoader(StepBatches(processor, args, step, stop), batch_size=None,
                                          num_workers=args.workers, prefetch_factor=8 if args.workers else None)
    for batch, token_truth, queries in batches:
        for group, base in zip(opt.param_groups, base_lrs):
            group["lr"] = base * lr_scale(step, args.warmup, args.steps)
        lm_loss, aux = losses_of(model, aux_head, batch.to(args.device), token_truth.to(args.device), captured, args,
                                 queries)
        opt.zero_grad(set_to_none=True)
        (lm_loss + args.aux_weight * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append((lm_loss.item(), aux.item()))
        step += 1
        if step % 25 == 0:
            lm, ax = (sum(v) / len(losses) for v in zip(*losses))
            print(f"step {step} loss {lm:.4f} aux {ax:.4f} {(time.time() - t0) / 25:.2f}s/step", flush=True)
            losses, t0 = [], time.time()
        if step % args.probe_every == 0 or step == stop:  # a run always ends with an export
            acc = probe(model, processor, args.probe_per_type, args.device, ("en", "zh") if zh else ("en",))
            mean = sum(acc.values()) / len(acc)
            print(f"probe step {step} " + " ".join(f"{k}={v:.2f}" for k, v in acc.items()) + f" mean={mean:.3f}",
                  flush=True)
            export(model, tokenizer, os.path.join(args.out, "latest"))
            export(model, tokenizer, os.path.join(args.out, "steps", str(step)))  # candidates for eval_tiny
            if mean >= best:
                best = mean
                export(model, tokenizer, os.path.join(args.out, "best"))
        if time.time() - last_save > args.save_every_s or step == stop:
            tmp = ckpt_path + ".tmp"
            torch.save({"model": model.state_dict(), "aux_head": aux_head.state_dict(), "opt": opt.state_dict(),
                        "step": step, "best": best}, tmp)
            os.replace(tmp, ckpt_path)
            last_save = time.time()


if __name__ == "__main__":
    main()
