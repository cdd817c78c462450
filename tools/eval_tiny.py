"""Accuracy of a Qwen-VL checkpoint on freshly generated shape scenes, per question type (greedy decoding).

    python -m tools.eval_tiny --model assets/tiny-qwen-vl --per-type 500 --backend engine

Backends: `engine` (minivlm.Engine), `hf` (transformers' generate), `both` (also reports how often they agree).
Row `follow_up` asks a second question in the same chat, after the model's own first answer.
"""
import argparse
import random

import torch

from tools.scenes import QUESTION_TYPES, ask, possible_types, random_scene, render, sample

EVAL_SEED = 7_000_000  # far from the training seeds' stream; every scene here is freshly generated


def chat(image, turns):
    """HF messages for one image and alternating (question, answer) turns; the last answer is None."""
    messages = []
    for i, (question, answer) in enumerate(turns):
        content = [{"type": "image", "image": image}, {"type": "text", "text": question}] if i == 0 else question
        messages.append({"role": "user", "content": content})
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
    return messages


def items(qtype: str, n: int, seed: int):
    """n fresh (messages, truth) pairs; follow_up chats carry a first turn answered with the truth."""
    out = []
    for i in range(n):
        s = seed + 100_000 * (QUESTION_TYPES + ("follow_up",)).index(qtype) + i
        if qtype != "follow_up":
            image, question, answer, _ = sample(s, qtype)
            out.append((chat(image, [(question, None)]), answer))
            continue
        rng = random.Random(s)
        scene = random_scene(rng)
        first = ask(scene, rng.choice(possible_types(scene)), rng)
        question, answer = ask(scene, rng.choice(possible_types(scene)), rng)
        out.append((chat(render(scene), [first, (question, None)]), answer))
    return out


class HFBackend:
    """Greedy answers from transformers' own model and generate()."""

    def __init__(self, model_dir: str, batch_size: int = 32):
        from transformers import AutoConfig, AutoModelForImageTextToText

        from minivlm.processor import load_processor
        config = AutoConfig.from_pretrained(model_dir)
        self.processor = load_processor(model_dir, config.model_type)
        self.processor.tokenizer.padding_side = "left"
        self.model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.batch_size = batch_size

    @torch.no_grad()
    def answer(self, chats, max_tokens: int = 4):
        """Greedy completions (special tokens dropped) of a list of chats."""
        texts = []
        for i in range(0, len(chats), self.batch_size):
            part = chats[i:i + self.batch_size]
            batch = self.processor.apply_chat_template(part, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True, return_tensors="pt",
                                                       processor_kwargs={"padding": True})
            out = self.model.generate(**batch, max_new_tokens=max_tokens, do_sample=False)
            new = out[:, batch["input_ids"].shape[1]:]
            texts += [t.strip() for t in self.processor.tokenizer.batch_decode(new, skip_special_tokens=True)]
        return texts


class EngineBackend:
    """Greedy answers from minivlm's Engine (all requests of a call batched together)."""

    def __init__(self, model_dir: str, **engine_kwargs):
        from minivlm import Engine, EngineConfig
        self.engine = Engine(EngineConfig(model=model_dir, device="cpu", dtype="float32", **engine_kwargs))

    def answer(self, chats, max_tokens: int = 4):
        """Greedy completions of a list of chats."""
        from minivlm import Request, SamplingParams
        outs = self.engine.generate([Request(messages=m) for m in chats],
                                    SamplingParams(max_tokens=max_tokens, temperature=0.0))
        return [o.text.strip() for o in outs]


def evaluate(backend, per_type: int, seed: int = EVAL_SEED, types=None):
    """{qtype: (accuracy, n)} and the answers given, on fresh scenes."""
    table, answers = {}, {}
    for qtype in types or QUESTION_TYPES + ("follow_up",):
        data = items(qtype, per_type, seed)
        got = backend.answer([m for m, _ in data])
        table[qtype] = (sum(g == truth for g, (_, truth) in zip(got, data)) / len(data), len(data))
        answers[qtype] = got
    return table, answers


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="assets/tiny-qwen-vl")
    p.add_argument("--per-type", type=int, default=100)
    p.add_argument("--seed", type=int, default=EVAL_SEED)
    p.add_argument("--backend", choices=["engine", "hf", "both"], default="engine")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    names = ["engine", "hf"] if args.backend == "both" else [args.backend]
    results = {}
    for name in names:
        backend = EngineBackend(args.model) if name == "engine" else HFBackend(args.model)
        results[name] = evaluate(backend, args.per_type, args.seed)
    print("| question type | n | " + " | ".join(f"{n} accuracy" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for qtype, (_, n) in results[names[0]][0].items():
        print(f"| {qtype} | {n} | " + " | ".join(f"{results[k][0][qtype][0]:.1%}" for k in names) + " |")
    if len(names) == 2:
        pairs = [(a, b) for q in results["engine"][1] for a, b in zip(results["engine"][1][q], results["hf"][1][q])]
        print(f"engine == hf on {sum(a == b for a, b in pairs)}/{len(pairs)} answers")


if __name__ == "__main__":
    main()
