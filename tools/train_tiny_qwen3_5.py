"""Train the tiny Qwen3.5 (Gated DeltaNet + gated attention, 3:1, with an MTP head) on the tiny Qwen3-VL's scenes and
questions, English and Chinese, distilled from that trained model (seeded, resumable).

    nice -n 10 python -m tools.train_tiny_qwen3_5 --out runs/q35 --steps 6000

The tokenizer, processor and vision tower are the tiny Qwen3-VL's (Qwen3.5's tower is Qwen3-VL's without DeepStack,
so every other weight maps exactly; frozen unless --vision-lr), and so is its tied embedding; the decoder learns from
the answers' cross-entropy, the teacher's answer distributions (KL) and, beside them, the MTP loss (token t+2 from
h_t and the embedding of t+1; tools/tiny_qwen3_5.py); --hidden-weight, --deepstack-weight and --colour-weight add
the distillation and vision signals that assets/tiny-qwen3_5-vl-wip/README.md measured the need for. Every batch is tools/train_tiny.make_batch's, a pure function of (seed,
step); the state (ckpt.pt) is saved every --save-every-s and at the end, so a resumed run sees the same data.
"""
import argparse
import math
import os
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import Qwen3_5ForConditionalGeneration, Qwen3VLForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutputWithPooling

from minivlm.inputs.processor import load_processor
from tools.tiny_qwen3_5 import MTPHead, copy_from_teacher, export, student_config
from tools.tiny_qwen3_5_colour import PALETTE, colour_labels
from tools.tiny_qwen3_5_probe import probe_all
from tools.train_tiny import PATCH, ZH_WEIGHTS, make_batch

TEACHER = "assets/tiny-qwen-vl"


def data_args(args):
    """The fields tools/train_tiny.conversation reads: its fine-tuning mixture (all seven forms, 2-4 turns, 1-3
    shapes) with the stage-3 language shares."""
    return SimpleNamespace(seed=args.seed, batch_size=args.batch_size, init="distill", curriculum_steps=0,
                           focus_from=0, bind_from=0, shapes_ramp=0, kind_twins=args.kind_twins,
                           near_cut=args.near_cut, zh=args.zh, zh_mixed=args.zh_mixed,
                           type_weights=dict(ZH_WEIGHTS, **args.type_weights))


def forward(student, mtp, batch, image_features, layers: list = None):
    """Main logits, MTP logits (position i predicts token i+2) and the final hidden states of one batch."""
    model = student.model
    embeds = model.get_input_embeddings()(batch["input_ids"])
    mask = (batch["input_ids"] == student.config.image_token_id).unsqueeze(-1)
    embeds = embeds.masked_scatter(mask, image_features.to(embeds.dtype))
    model.rope_deltas = None
    positions = model.compute_3d_position_ids(input_ids=batch["input_ids"], inputs_embeds=embeds,
                                              image_grid_thw=batch["image_grid_thw"],
                                              attention_mask=batch["attention_mask"],
                                              mm_token_type_ids=batch.get("mm_token_type_ids"))
    out = model.language_model(inputs_embeds=embeds, position_ids=positions, attention_mask=batch["attention_mask"],
                               output_hidden_states=layers is not None)
    hidden = out.last_hidden_state
    if layers is not None:  # every decoder layer's output, for the layer-wise distillation
        layers.extend(out.hidden_states[1:])
    lm_head = student.lm_head
    rope = model.language_model.rotary_emb(hidden, positions[-3:, :, :-1])  # the MTP at i sits at position i
    drafted = mtp(embeds[:, 1:], hidden[:, :-1], rope)
    return lm_head(hidden), lm_head(drafted), hidden


def losses(student, mtp, teacher, batch, captured, args, aux=None, truth=None):
    """{term: loss}: answer CE, KL to the teacher on answer tokens, MTP CE on answer tokens two ahead; with
    --hidden-weight the layer-wise distance to the teacher's decoder (both 4 layers of width 128); with
    --deepstack-weight the `aux` head's relative error predicting the teacher's DeepStack tokens from the student's
    final vision tokens; with --colour-weight a per-token colour CE on them, with --kind-weight the shape kind's and
    with --cell-weight the 3 x 3 cell of its shape's centre (`truth`: train_signals.token_labels' rows)."""
    labels = batch.pop("labels")
    with torch.no_grad():
        taught = teacher(**batch, output_hidden_states=bool(args.hidden_weight))
    teacher_logits, layers = taught.logits, [] if args.hidden_weight else None
    features, zero = captured["tokens"], torch.zeros(())
    deep = colour = kind = cell = zero
    kinds = truth[:, 0].long() if truth is not None else None
    if args.vision_lr > 0:  # the student's own (trained) tower
        features = torch.cat(student.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"])
                             .pooler_output)
    if args.deepstack_weight:  # what the teacher's decoder got only through DeepStack, read from the final tokens
        target = torch.cat(captured["deepstack"], -1)
        deep = (aux["deepstack"](features) - target).pow(2).mean() / target.var()
    if args.colour_weight:  # and the colour itself, per token: the tower's final tokens lacked it (probe_vision_colour)
        labels_c = colour_labels(batch["pixel_values"], kinds, PATCH)
        colour = F.cross_entropy(aux["colour"](features), labels_c) if (labels_c != -100).any() else zero
    if args.kind_weight:  # which shape (or background) each token shows: "is there a ...?" needs kind and colour
        kind = F.cross_entropy(aux["kind"](features), kinds)
    if args.cell_weight:  # "where": the cell of the token's shape's centre, so one attention layer can read it off
        inside = kinds < 3
        cells = (3 * truth[:, 4]).long().clamp(max=2) * 3 + (3 * truth[:, 3]).long().clamp(max=2)
        cell = F.cross_entropy(aux["cell"](features[inside]), cells[inside]) if inside.any() else zero
    logits, drafted, _ = forward(student, mtp, batch, features, layers)
    target = labels[:, 1:]
    keep = target != -100
    ce = F.cross_entropy(logits[:, :-1][keep], target[keep])
    kl = F.kl_div(F.log_softmax(logits[:, :-1][keep] / args.kd_temp, -1),
                  F.log_softmax(teacher_logits[:, :-1][keep] / args.kd_temp, -1), log_target=True,
                  reduction="batchmean") * args.kd_temp ** 2
    target2 = labels[:, 2:]
    keep2 = target2 != -100
    mtp_ce = F.cross_entropy(drafted[:, :-1][keep2], target2[keep2])
    hidden = zero
    if args.hidden_weight:  # each layer's output near the teacher's, relative to its size, at every real position
        real = batch["attention_mask"].bool()
        hidden = sum(((s - t).pow(2).mean(-1) / t.pow(2).mean(-1).clamp(min=1e-6))[real].mean()
                     for s, t in zip(layers, taught.hidden_states[1:])) / len(layers)
    return {"ce": ce, "kl": kl, "mtp": mtp_ce, "hidden": hidden, "deepstack": deep, "colour": colour, "kind": kind,
            "cell": cell}


def trained_state(student) -> dict:
    """The student's weights but the frozen vision tower (copied from the teacher at every start): a smaller ckpt."""
    return {k: v for k, v in student.state_dict().items() if not k.startswith("model.visual.")}


def lr_scale(step: int, warmup: int, total: int) -> float:
    """Linear warmup, then cosine decay to 10 %."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def build(args):
    """Teacher, processor, student (weights copied from the teacher where they map) and a fresh MTP head."""
    teacher = Qwen3VLForConditionalGeneration.from_pretrained(TEACHER, dtype=torch.float32).eval()
    teacher.requires_grad_(False)
    processor = load_processor(TEACHER, "qwen3_vl")
    processor.tokenizer.padding_side = "right"
    torch.manual_seed(args.seed)
    config = student_config(processor.tokenizer)
    config.text_config._attn_implementation = "sdpa"
    student = Qwen3_5ForConditionalGeneration(config)
    if args.copy != "none":
        copy_from_teacher(student, teacher, decoder=args.copy == "all")
    # frozen, it sees exactly what the teacher sees; trained, its final tokens can take on what DeepStack carried
    student.model.visual.requires_grad_(args.vision_lr > 0)
    mtp = MTPHead(config.text_config)
    return teacher, processor, student, mtp


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/q35")
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--stop-at", type=int, default=None, help="stop (with a checkpoint) before --steps")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--deepstack-weight", type=float, default=0.0,
                   help="with --vision-lr: aux loss, the teacher's DeepStack tokens predicted from the final ones")
    p.add_argument("--colour-weight", type=float, default=0.0,
                   help="with --vision-lr: aux CE, each in-shape final vision token's colour (tools/tiny_qwen3_5_colour)")
    p.add_argument("--kind-weight", type=float, default=0.0,
                   help="with --vision-lr: aux CE, each final vision token's shape kind (or background)")
    p.add_argument("--cell-weight", type=float, default=0.0,
                   help="with --vision-lr: aux CE, each in-shape final vision token's 3 x 3 cell of its shape's centre")
    p.add_argument("--vision-lr", type=float, default=0.0,
                   help="train the vision tower at this lr (0: frozen, the teacher's)")
    p.add_argument("--kd-weight", type=float, default=1.0, help="KL to the teacher's answer distributions")
    p.add_argument("--kd-temp", type=float, default=1.0)
    p.add_argument("--hidden-weight", type=float, default=0.0,
                   help="layer-wise distillation: each decoder layer's output to the teacher's (relative MSE)")
    p.add_argument("--mtp-weight", type=float, default=0.5, help="the MTP head's CE (token t+2), beside the main loss")
    p.add_argument("--copy", choices=["all", "embed", "none"], default="all",
                   help="teacher weights copied in: all that maps, the vision tower and embedding only, or none")
    p.add_argument("--zh", type=float, default=0.45, help="share of chats asked wholly in Chinese")
    p.add_argument("--zh-mixed", type=float, default=0.15, help="share of chats drawing each turn's language")
    p.add_argument("--type-weights", default={}, type=lambda s: {k: float(v) for k, v in
                                                                 (kv.split("=") for kv in s.split(",") if kv)},
                   help="question forms asked more or less than the stage-3 mixture, e.g. is_there=4,where=5")
    p.add_argument("--kind-twins", type=float, default=0.3)
    p.add_argument("--near-cut", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-every-s", type=float, default=180)
    p.add_argument("--probe-every", type=int, default=250)
    p.add_argument("--probe-per-type", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    teacher, processor, student, mtp = build(args)
    captured = {}
    teacher.model.visual.register_forward_hook(
        lambda m, i, out: captured.update(tokens=out.pooler_output, deepstack=out.deepstack_features))
    width = student.config.text_config.hidden_size  # the heads are not shipped: they only shape the tower's gradient
    aux = torch.nn.ModuleDict({"deepstack": torch.nn.Linear(width, width * len(
        teacher.config.vision_config.deepstack_visual_indexes)), "colour": torch.nn.Linear(width, len(PALETTE)),
        "kind": torch.nn.Linear(width, 4), "cell": torch.nn.Linear(width, 9)})  # new heads last: saved indices hold
    text = [q for n, q in student.named_parameters() if not n.startswith("model.visual.")] + list(mtp.parameters())
    groups = [{"params": text, "lr": args.lr}]
    if args.vision_lr > 0:
        groups.append({"params": list(student.model.visual.parameters()) + list(aux.parameters()),
                       "lr": args.vision_lr})
    params = [q for g in groups for q in g["params"]]
    opt = torch.optim.AdamW(groups, weight_decay=0.01, betas=(0.9, 0.98))
    ckpt_path, step = os.path.join(args.out, "ckpt.pt"), 0
    os.makedirs(args.out, exist_ok=True)
    if os.path.exists(ckpt_path):
        state = torch.load(ckpt_path, weights_only=False, map_location="cpu")
        missing = student.load_state_dict(state["model"], strict=False).missing_keys
        assert all(k.startswith("model.visual.") for k in missing), missing  # only the frozen tower is left out
        mtp.load_state_dict(state["mtp"])
        if "aux" in state:  # older states hold the DeepStack head alone
            aux.load_state_dict(state["aux"], strict=False) if "colour.weight" in state["aux"] else \
                aux["deepstack"].load_state_dict(state["aux"])
        for saved, group in zip(state["opt"]["param_groups"], opt.param_groups):  # parameters joining start fresh
            for index, q in zip(saved["params"], group["params"]):
                if index in state["opt"]["state"]:
                    opt.state[q] = state["opt"]["state"][index]
        step = state["step"]
        print(f"resumed at step {step}", flush=True)
    print(f"params {sum(q.numel() for q in student.parameters()):,} + mtp {sum(q.numel() for q in mtp.parameters()):,}",
          flush=True)
    student.train()
    mtp.train()
    data = data_args(args)
    stop = min(args.stop_at or args.steps, args.steps)
    last_save, t0, logged = time.time(), time.time(), []
    while step < stop:
        for group, base in zip(opt.param_groups, [args.lr, args.vision_lr]):
            group["lr"] = base * lr_scale(step, args.warmup, args.steps)
        batch, token_truth, _ = make_batch(processor, step, data)
        terms = losses(student, mtp, teacher, batch, captured, args, aux, token_truth)
        weights = {"ce": 1.0, "kl": args.kd_weight, "mtp": args.mtp_weight, "hidden": args.hidden_weight,
                   "deepstack": args.deepstack_weight, "colour": args.colour_weight, "kind": args.kind_weight,
                   "cell": args.cell_weight}
        opt.zero_grad(set_to_none=True)
        sum(weights[k] * v for k, v in terms.items()).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        logged.append([v.item() for v in terms.values()])
        step += 1
        if step % 25 == 0:
            means = " ".join(f"{k} {sum(v) / len(logged):.4f}" for k, v in zip(terms, zip(*logged)))
            print(f"step {step} {means} {(time.time() - t0) / 25:.2f}s/step", flush=True)
            logged, t0 = [], time.time()
        if step % args.probe_every == 0 or step == stop:
            acc = probe_all(student, mtp, processor, args.probe_per_type)
            print(f"probe step {step} " + " ".join(f"{k}={v:.2f}" for k, v in acc.items()), flush=True)
            export(student, mtp, processor.tokenizer, os.path.join(args.out, "steps", str(step)), TEACHER)
            student.train()
            mtp.train()
        if time.time() - last_save > args.save_every_s or step == stop:
            tmp = ckpt_path + ".tmp"
            torch.save({"model": student.state_dict() if args.vision_lr > 0 else trained_state(student), "mtp": mtp.state_dict(), "aux": aux.state_dict(), "opt": opt.state_dict(),
                        "step": step, "args": vars(args)}, tmp)
            os.replace(tmp, ckpt_path)
            last_save = time.time()


if __name__ == "__main__":
    main()
