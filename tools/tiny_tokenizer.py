"""A small byte-level BPE tokenizer with Qwen's special tokens and a Qwen-VL chat template."""
import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]

# Qwen3-VL style: no default system prompt; images render as <|vision_start|><|image_pad|><|vision_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "What color is the shape?", "What shape is it?", "How many shapes are there?",
    "What color is the circle?", "What color is the square?", "What color is the triangle?",
    "Is there a red circle?", "Is there an orange square?", "Is there a blue triangle?",
    "red green blue yellow purple orange circle square triangle one two three yes no",
    "user assistant system Describe the image. Hello, how are you? The quick brown fox jumps over the lazy dog.",
    *("red green blue yellow purple orange circle square triangle one two three yes no".split() * 20),
    "There is a shape in the picture. 0 1 2 3 4 5 6 7 8 9 , . ? ! : ; ' \" ( ) - +",
]


# words of the describe/where answers, added after the first training run as whole tokens (with and without the
# leading space that byte-level BPE folds into a word); existing ids stay as they were
POSITION_WORDS = ("Where", "top", "middle", "bottom", "center", "left", "right",
                  " top", " middle", " bottom", " center", " left", " right", " at", " and")


def extend_tokenizer(tokenizer: PreTrainedTokenizerFast, words=POSITION_WORDS) -> PreTrainedTokenizerFast:
    """Make each word one token by appending BPE merges (lowest priority) that join its current pieces left to
    right; every existing id and every text without these words tokenizes exactly as before."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab, merges = state["model"]["vocab"], state["model"]["merges"]
    for word in words:
        pieces = Tokenizer.from_str(json.dumps(state)).encode(word).tokens
        while len(pieces) > 1:
            joined = pieces[0] + pieces[1]
            merges.append([pieces[0], pieces[1]])
            if joined not in vocab:
                vocab[joined] = 1 + max(max(vocab.values()), *(t["id"] for t in state["added_tokens"]))
            pieces = [joined] + pieces[2:]
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)),
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tokenizer(vocab_size: int = 512, corpus=None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the task's words; every answer word ends up one or two tokens. Its 438 tokens
    were the first model's vocabulary; `extend_tokenizer` adds the position words on top."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    lines = list(corpus or CORPUS)
    tok.train_from_iterator(lines * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    return fast
