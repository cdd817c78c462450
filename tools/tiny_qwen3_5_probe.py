"""A fast validation probe of the tiny Qwen3.5 while it trains: teacher-forced exact match per question form in
both languages (tools/train_tiny.probe's rows and scenes), and how often the MTP head's draft of token t+2 equals the
main model's own greedy token there, on descriptions (the acceptance a k = 1 speculation would see)."""
import torch

from tools.scenes import sample
from tools.train_tiny import PROBE_ROWS, VALID_SEED, answer_labels


@torch.no_grad()
def probe_all(student, mtp, processor, per_type: int = 20, langs=("en", "zh")) -> dict:
    """{row: exact-match share} (Chinese rows prefixed zh_) and {mtp_accept[_zh]: acceptance on describe rows}."""
    from tools.train_tiny_qwen3_5 import forward
    student.eval()
    mtp.eval()
    tok = processor.tokenizer
    prefix, end_id = tok("<|im_start|>assistant\n").input_ids, tok.convert_tokens_to_ids("<|im_end|>")
    acc, accepted = {}, {lang: [] for lang in langs}
    for lang in langs:
        for row, (qtype, num) in enumerate(PROBE_ROWS):
            items = [sample(VALID_SEED + 1000 * row + i, qtype, num, lang) for i in range(per_type)]
            texts = [processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {
                "type": "text", "text": q}]}, {"role": "assistant", "content": a}], tokenize=False)
                for _, q, a, _ in items]
            batch = processor(text=texts, images=[im for im, _, _, _ in items], padding=True, return_tensors="pt")
            features = torch.cat(student.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"])
                                 .pooler_output)
            logits, drafted, _ = forward(student, mtp, batch, features)
            labels = answer_labels(batch["input_ids"], prefix, end_id)
            greedy = logits.argmax(-1)
            hit = (greedy[:, :-1] == labels[:, 1:]) | (labels[:, 1:] == -100)
            name = qtype if num is None else f"{qtype}_{num}"
            acc[name if lang == "en" else f"{lang}_{name}"] = hit.all(-1).float().mean().item()
            if qtype == "describe":  # drafted[:, i] guesses token i+2, which the main model gives at i+1
                keep = labels[:, 2:] != -100
                accepted[lang].append((drafted[:, :-1].argmax(-1) == greedy[:, 1:-1])[keep].float())
    for lang in langs:
        acc["mtp_accept" + ("" if lang == "en" else f"_{lang}")] = torch.cat(accepted[lang]).mean().item()
    return acc
