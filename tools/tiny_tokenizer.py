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
    "{% elif item['type'] == 'video' or 'video' in item %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
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


# stage 3 (Chinese): the answer words and question words of the Chinese forms (tools/scenes.py: ZH_*) as whole
# tokens, after their single characters (each CJK character one token, so other Chinese text splits by character
# where it can, and byte fallback covers the rest); merges are added in this order, so characters join first
ZH_WORDS = ("红色", "绿色", "蓝色", "黄色", "紫色", "橙色", "圆形", "正方形", "三角形", "一个", "两个", "三个",
            "没有", "左上", "上方", "右上", "左侧", "中间", "右侧", "左下", "下方", "右下",
            "这个", "形状", "什么", "颜色", "这是", "图中", "几个", "哪里", "描述", "这张", "图片")
ZH_PUNCTUATION = ("，", "？", "。", "！", "：", "、")
# common characters beyond those of the forms, so a classroom's own Chinese question still splits by character
ZH_COMMON = "的是不了我你他她们这那个有在和吗呢吧啊人大小多少几上下左右中间前后里外面边一二三四五六七八九十零" \
            "好请问看说图片画张色颜形状圆方角点线长短高低红绿蓝黄紫橙黑白灰粉棕"


def zh_tokens() -> tuple:
    """Every token stage 3 adds, in merge order: punctuation and single characters, then the words."""
    chars = dict.fromkeys(ZH_COMMON + "".join(ZH_WORDS) + "在吗的有是")
    return (*ZH_PUNCTUATION, *chars, *ZH_WORDS)


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


# What each family's published tokenizer adds for images, and its chat template (images as the processor expects
# them: the processor expands each placeholder into the image's tokens).
SMOLVLM_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
                  *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]
SMOLVLM_TEMPLATE = (  # SmolVLM2's: "User:<image>question<end_of_utterance>\nAssistant:"
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
INTERNVL_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                   "video_token": "<video>"}
INTERNVL_TEMPLATE = CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<IMG_CONTEXT>\\n")
TEXT_TEMPLATE = CHAT_TEMPLATE  # Qwen2 / Qwen3 chat format; a text model's template never sees an image
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
GEMMA3_TEMPLATE = (  # Gemma 3's (minus its role-alternation check): a system turn is folded into the first user turn
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def family_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """The tiny BPE with the special tokens and chat template of `family`'s published checkpoints."""
    base = build_tokenizer().backend_tokenizer
    common = dict(tokenizer_object=base, pad_token="<|endoftext|>")
    if family in ("smolvlm", "idefics3"):
        tok = PreTrainedTokenizerFast(**common, eos_token="<end_of_utterance>", extra_special_tokens={"fake_image_token": "<fake_token_around_image>",
                                                            "image_token": "<image>", "global_image_token": "<global-img>",
                                                            "end_of_utterance_token": "<end_of_utterance>"})
        tok.add_tokens(SMOLVLM_TOKENS, special_tokens=True)  # the <row_i_col_j> markers are one token each
        tok.chat_template = SMOLVLM_TEMPLATE
    elif family == "gemma3":  # Gemma's <bos>/<eos>/<pad>, its image markers and turn tokens, one token each
        tok = PreTrainedTokenizerFast(tokenizer_object=base, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                      extra_special_tokens=GEMMA3_TOKENS)
        tok.add_tokens(["<start_of_turn>", "<end_of_turn>"], special_tokens=True)
        tok.chat_template = GEMMA3_TEMPLATE
    elif family == "internvl":
        tok = PreTrainedTokenizerFast(**common, eos_token="<|im_end|>", extra_special_tokens=INTERNVL_TOKENS)
        tok.add_tokens(SPECIAL_TOKENS[1:], special_tokens=True)
        tok.chat_template = INTERNVL_TEMPLATE
    else:
        tok = PreTrainedTokenizerFast(**common, eos_token="<|im_end|>", additional_special_tokens=SPECIAL_TOKENS[1:])
        tok.chat_template = TEXT_TEMPLATE
    return tok
