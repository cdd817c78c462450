"""Messages of the chat tab, and the engine's refusals a person meets there (error.<reason>: each English text is the
engine's own sentence with {fields}; panels/i18n/errors.py fills the Chinese from the refusal's fields).
id -> (English, 简体中文)."""
from minivlm.model.backends import WORDS

MESSAGES = {
    "chat.history": ("chat history", "对话记录"),
    "chat.input": ("message (text and images)", "消息（文字和图片）"),
    "chat.placeholder": ("Attach an image and ask about it, e.g. Describe the picture.",
                         "附上一张图片再提问，例如 描述这张图片。"),
    "chat.input_aria": ("Message to the model (attach images with the paperclip button)",
                        "发给模型的消息（用回形针按钮附加图片）"),
    "chat.stop": ("Stop", "停止"),
    "chat.regenerate": ("Regenerate", "重新生成"),
    "chat.clear": ("Clear chat", "清空对话"),
    "chat.stats": ("answer statistics", "回答统计"),
    "chat.system": ("system prompt (sent before the conversation; empty = none)",
                    "系统提示词（在对话之前发送；留空 = 无）"),
    "chat.sampling": ("Sampling", "采样"),
    "chat.max_tokens": ("max tokens", "最大 token 数"),
    "chat.temperature": ("temperature (0 = greedy)", "温度（0 = 贪心）"),
    "chat.top_p": ("top-p", "top-p"),
    "chat.top_k": ("top-k (0 = off)", "top-k（0 = 关闭）"),
    "chat.seed": ("seed (empty = engine's)", "随机种子（留空 = 引擎的）"),
    "chat.seed_placeholder": ("engine's seed", "引擎的种子"),
    "chat.ignore_eos": ("ignore EOS (keep decoding to max tokens)", "忽略 EOS（一直解码到最大 token 数）"),
    "chat.examples": ("Example scenes (the tiny model was trained on such scenes)",
                      "示例场景（微型模型就是在这类场景上训练的）"),
    "chat.examples_zh": ("The same scenes, asked in Chinese (the tiny model answers in Chinese)",
                         "同样的场景，用中文提问（微型模型用中文回答）"),
    "chat.examples_general": ("Examples for a general vision-language model (open questions about the same pictures)",
                              "通用视觉语言模型的示例（关于同样图片的开放式问题）"),
    "chat.examples_general_zh": ("The same, asked in Chinese (Qwen-VL models answer in Chinese)",
                                 "同样的问题，用中文提问（Qwen-VL 模型用中文回答）"),
    "chat.cleared_for_model": ("⟳ The engine now serves **{model}**: the conversation with {old} was cleared (a model "
                               "continues only its own answers).",
                               "⟳ 引擎现在运行 **{model}**：与 {old} 的对话已清空（模型只能接着自己的回答往下说）。"),
    "chat.rebuilt_note": ("⟳ The engine was rebuilt (**{model}**, prefix cache empty): the answers above came from the "
                          "previous engine; the next question computes the whole conversation again.",
                          "⟳ 引擎已重建（**{model}**，前缀缓存为空）：上面的回答来自之前的引擎；下一个问题会重新计算整段对话。"),
    "chat.video_examples": ("A short clip (for a Qwen2-VL / 2.5-VL / 3-VL checkpoint; the tiny model takes images only)",
                            "一段短视频（适用于 Qwen2-VL / 2.5-VL / 3-VL 检查点；微型模型只接受图片）"),
    "chat.trained_label": ("questions the model was trained on", "模型训练过的问题"),
    "chat.trained": ("**This model was trained on these questions** about {about}: {questions}. Others get a guess, "
                     "and the chat says so.",
                     "**这个模型训练过以下关于“{about}”的问题**：{questions}。其他问题只能得到猜测，对话里会注明。"),
    "chat.error_title": ("⚠️ request refused", "⚠️ 请求被拒绝"),
    "chat.hint_title": ("ⓘ hint", "ⓘ 提示"),
    "chat.paused": ("⏸ The engine is paused for step-through (KV blocks tab): this answer continues when someone "
                    "presses Step or Run (resume) there, or by itself within 2 minutes once no page watches the pause.",
                    "⏸ 引擎因单步演示而暂停（KV 块页签）：有人在那里按下“单步”或“运行（恢复）”后，这个回答会继续；"
                    "若没有页面再关注这次暂停，2 分钟内也会自行继续。"),
    "chat.refused_line": ("refused (the reason is in the chat)", "已拒绝（原因见对话）"),
    "chat.no_picture_line": ("not sent to the model: it needs a picture", "未发送给模型：它需要一张图片"),
    "chat.empty_answer": ("(empty answer · finish: {reason})", "（空回答 · 结束原因：{reason}）"),
    "chat.stats_line": ("{n} tokens in {secs} s ({rate} tok/s) · prompt {prompt} tokens, {cached} from the prefix "
                        "cache · finish: {reason}",
                        "{n} 个 token，用时 {secs} 秒（{rate} token/秒）· 提示词 {prompt} 个 token，其中 {cached} 个"
                        "来自前缀缓存 · 结束原因：{reason}"),
    "chat.type_first": ("Type a question or attach an image first.", "请先输入问题或附上一张图片。"),
    "chat.one_at_a_time": ("One answer at a time per session: wait for the current one to finish, or press Stop.",
                           "每个会话一次只生成一个回答：请等当前回答结束，或按“停止”。"),
    "chat.nothing_to_regenerate": ("Nothing to regenerate yet: ask a question first.", "还没有可重新生成的内容：请先提问。"),
    "chat.bad_seed": ("The seed must be a whole number or empty (the engine's), not “{text}”.",
                      "随机种子必须是整数或留空（使用引擎的），而不是“{text}”。"),
    "chat.hint_no_picture": ("This model only answers questions about a picture of {about}: attach one, or click an "
                             "example scene below. It was trained on: {questions}",
                             "这个模型只回答关于“{about}”图片的问题：请附上一张图片，或点击下方的示例场景。它训练过的问题："
                             "{questions}"),
    "chat.hint_untrained": ("“{question}” is not one of the questions this model was trained on, so its answer is a "
                            "guess. It knows: {questions}",
                            "“{question}”不是这个模型训练过的问题，所以它的回答只是猜测。它会的问题：{questions}"),
    "chat.json_answer": ("JSON answer", "JSON 回答"),
    "chat.json_about": ("Give a JSON Schema and the answer follows it: the engine's grammar (structured outputs) "
                        "masks every token the schema does not allow, so the answer is valid JSON whatever the model "
                        "would have written (the tiny model never saw JSON: its JSON is valid, its facts often "
                        "wrong). JSON takes many tokens on this model's small vocabulary: a preset raises max tokens "
                        "to 200. Watch the KV blocks tab's step-through: each constrained step says how many tokens "
                        "the grammar allowed and which one was chosen.",
                        "给出一个 JSON Schema，回答就会遵循它：引擎的语法约束（结构化输出）会屏蔽 schema 不允许的每个 "
                        "token，所以无论模型本来会写什么，回答都是合法的 JSON（微型模型从没见过 JSON：它写的 JSON 合法，"
                        "内容却常常不对）。在这个模型的小词表上 JSON 要用很多 token：选一个预设会把最大 token 数提到 200。"
                        "在 KV 块页签里单步观察：每个受约束的步骤都会说明语法允许了多少个 token、选中了哪一个。"),
    "chat.json_preset": ("preset", "预设"),
    "chat.json_preset.none": ("none: a free answer", "无：自由回答"),
    "chat.json_preset.shapes": ("the shapes in the picture: a list of colour, shape and position",
                                "图中的形状：颜色、形状和位置的列表"),
    "chat.json_preset.one_shape": ("one shape: its colour and kind", "一个形状：颜色和种类"),
    "chat.json_preset.count": ("how many shapes: a whole number from 0 to 9", "有几个形状：0 到 9 的整数"),
    "chat.json_preset.yes_no": ("yes or no, and whether it is sure", "是或否，以及是否确定"),
    "chat.json_schema": ("JSON Schema (empty = a free answer)", "JSON Schema（留空 = 自由回答）"),
    "chat.json_result": ("the answer, parsed", "解析后的回答"),
    "chat.json_result_line": ("about the parsed answer", "关于解析后的回答"),
    "chat.json_parsed": ("✓ The answer parses as JSON and follows the schema: the grammar allowed no other token.",
                         "✓ 回答可以解析为 JSON，并且符合 schema：语法不允许任何别的 token。"),
    "chat.json_unfinished": ("The answer stopped at max tokens before its JSON closed: raise max tokens.",
                             "回答在 JSON 结束之前就达到了最大 token 数：请提高最大 token 数。"),
    "chat.json_not_json": ("The JSON Schema box does not hold JSON: {error}", "JSON Schema 框里的内容不是 JSON：{error}"),
    "chat.json_not_object": ("The JSON Schema must be a JSON object.", "JSON Schema 必须是一个 JSON 对象。"),
    "chat.example_aria": ("Example", "示例"),
    "chat.picture_aria": ("picture", "图片"),
    # the engine's refusals, error.<reason> (minivlm.Refused): said again from the refusal's fields; the English is
    # the engine's own sentence (tests/test_i18n.py checks it), shown as the engine wrote it on an English page
    "error.sampling_param": ("{name} must be {must}, got {value}", "{name} 不合要求（{must}），收到的是 {value}"),
    "error.messages_and_prompt": ("give either messages or prompt/images, not both",
                                  "请只给 messages，或只给 prompt/images，不要同时给"),
    "error.messages_shape": ("messages must be a non-empty list of dicts with 'role' and 'content'",
                             "messages 必须是非空列表，每项是含 'role' 和 'content' 的字典"),
    "error.empty_request": ("empty request: give a prompt, images, or messages", "空请求：请给出提示词、图片或 messages"),
    "error.image_file_too_large": ("{name} is {size} MiB, over the {limit} MiB limit per image; send a smaller file",
                                   "{name} 大小为 {size} MiB，超过了每张图片 {limit} MiB 的上限；请发送更小的文件"),
    "error.video_file_too_large": ("{name} is {size} MiB, over the {limit} MiB limit per video; send a shorter or "
                                   "smaller file",
                                   "{name} 大小为 {size} MiB，超过了每个视频 {limit} MiB 的上限；请发送更短或更小的文件"),
    "error.image_pixels": ("{name} is {pixels}, over the {limit} limit per image; downscale it first",
                           "{name} 有 {pixels}，超过了每张图片 {limit} 的上限；请先缩小"),
    "error.image_pixels_wh": ("{name} is {size} = {pixels}, over the {limit} limit per image; downscale it first",
                              "{name} 为 {size} = {pixels}，超过了每张图片 {limit} 的上限；请先缩小"),
    "error.request_pixels": ("the images of this request are {total} together ({parts}), over the {limit} limit per "
                             "request; send fewer or smaller images",
                             "这个请求的图片合计 {total}（{parts}），超过了每个请求 {limit} 的上限；请发送更少或更小的图片"),
    "error.server_busy": ("the server is decoding {used} of other requests' images, and {name} needs {pixels}: over "
                          "the {limit} limit at once; try again shortly",
                          "服务器正在解码其他请求的 {used} 图片，而 {name} 需要 {pixels}：超过了同时解码 {limit} 的上限；"
                          "请稍后再试"),
    "error.not_an_image": ("{name} is not a readable image: not a {formats} file, or damaged{detail}",
                           "{name} 不是可读的图片：不是 {formats} 文件，或已损坏{detail}"),
    "error.no_such_image": ("image path {path} does not exist", "图片路径 {path} 不存在"),
    "error.no_such_video": ("video path {path} does not exist", "视频路径 {path} 不存在"),
    "error.zero_size": ("{name} has zero size ({size})", "{name} 的尺寸为零（{size}）"),
    "error.prompt_too_long": ("prompt is {n} tokens; max_model_len is {limit} (prompt + output)",
                              "提示词有 {n} 个 token；max_model_len 是 {limit}（提示词 + 输出）"),
    "error.too_many_blocks": ("request needs up to {need} KV blocks but the engine has {have}; lower max_tokens or "
                              "raise num_blocks",
                              "请求最多需要 {need} 个 KV 块，但引擎只有 {have} 个；请降低 max_tokens 或增加 num_blocks"),
    "error.too_many_images": ("too many images: {n} (this engine allows {limit} per request)",
                              "图片太多：{n} 张（这个引擎每个请求最多 {limit} 张）"),
    "error.too_many_videos": ("too many videos: {n} (this engine allows {limit} per request)",
                              "视频太多：{n} 个（这个引擎每个请求最多 {limit} 个）"),
    "error.text_only": ("{model} is a text-only model: it takes no images ({n} given)",
                        "{model} 是纯文本模型：不接受图片（给了 {n} 张）"),
    "error.text_only_video": ("{model} is a text-only model: it takes no video", "{model} 是纯文本模型：不接受视频"),
    "error.takes_no_audio": ("audio input is not supported: minivlm serves text, images and video (a checkpoint's "
                             "audio tower is not loaded)",
                             "不支持音频输入：minivlm 只处理文本、图片和视频（检查点的音频塔不会加载）"),
    "error.takes_no_video": ("{model} takes no video ({n} given); video needs a Qwen2-VL, Qwen2.5-VL or Qwen3-VL "
                             "checkpoint", "{model} 不接受视频（给了 {n} 个）；视频需要 Qwen2-VL、Qwen2.5-VL 或 Qwen3-VL 检查点"),
    "error.video_frames": ("{name} has {frames} frames, over the {limit} limit per video; cut it shorter",
                           "{name} 有 {frames} 帧，超过了每个视频 {limit} 帧的上限；请剪短"),
    "error.video_seconds": ("{name} is {seconds} s long, over the {limit} s limit per video; cut it shorter",
                            "{name} 长 {seconds} 秒，超过了每个视频 {limit} 秒的上限；请剪短"),
    "error.not_a_video": ("{name} is not a readable video: not a {formats} file, or damaged ({detail})",
                          "{name} 不是可读的视频：不是 {formats} 文件，或已损坏（{detail}）"),
    "error.decoded_frames": ("{name}: {frames} sampled frames of {size} are {pixels}, over the {limit} limit of decoded "
                             "frames per request; ask for a lower fps or fewer frames, or send a smaller video",
                             "{name}：采样的 {frames} 帧（{size}）共 {pixels}，超过了每个请求解码帧 {limit} 的上限；"
                             "请降低 fps 或减少帧数，或发送更小的视频"),
    "error.videos_pixels": ("the videos of this request sample {pixels} of frames together, over the {limit} limit per "
                            "request; ask for a lower fps or fewer frames",
                            "这个请求的视频合计采样 {pixels} 的帧，超过了每个请求 {limit} 的上限；请降低 fps 或减少帧数"),
    "error.grammar_too_long": ("structured_outputs.{field} is {n} characters; the limit is {limit}",
                               "structured_outputs.{field} 有 {n} 个字符；上限是 {limit}"),
    "error.grammar_invalid": ("structured_outputs.{field} does not compile: {error}",
                              "structured_outputs.{field} 无法编译：{error}"),
    "error.grammar_complex": ("structured_outputs.{field} is too complex: {error}",
                              "structured_outputs.{field} 太复杂（超出编译预算）：{error}"),
    "error.engine_closed": ("this engine is closed", "这个引擎已关闭（设置栏重建了引擎）"),
    "error.image_name": ("image {n}", "图片 {n}"),  # how a refusal names the n-th image or video of a request
    "error.video_name": ("video {n}", "视频 {n}"),
}

# the engine's words in the status line and the device notes (engine.*): the English is the engine's own table
# (minivlm.model.backends.WORDS, where each sentence is written once); the Chinese here, by the same ids
ENGINE_ZH = {
    "engine.attn_inplace": "原地分页解码（直接在块表上运行的 C 内核{threads}）；预填充：SDPA",
    "engine.attn_flex": "原地分页解码（在块表上运行的 FlexAttention，已编译）；预填充：SDPA",
    "engine.attn_flash": "flash-attn 分页内核",
    "engine.attn_bf16_step": "解码在 C 步骤内原地读取分页缓存（bf16 缓存池，不复制）；提示词：SDPA（先收集块）",
    "engine.attn_gathered": "对收集起来的块做 SDPA{why}",
    "engine.why_kernel": "（原地内核：{why}）",
    "engine.why_flex": "（原地 FlexAttention：{state}）",
    "engine.why_flash_missing": "（未安装 flash-attn）",
    "engine.why_flash_shape": "（flash-attn 的分页内核需要 fp16/bf16，且块大小是 256 的倍数）",
    "engine.fp32_only": "只支持 fp32",
    "engine.decode_layer": "1–{rows} 个序列时每步一次 C 调用（decode_layer.c），更多序列时融合小算子（decode_ops.c）{threads}",
    "engine.decode_ops": "融合小算子（decode_ops.c）；decode_layer.c 未启用：{why}{threads}",
    "engine.decode_torch": "PyTorch 算子（{why}）",
    "engine.decode_layer_bf16": ("1–{rows} 个序列的解码步每步一次 C 调用，读 {weights} 权重和 bf16 缓存池，内部以 fp32 计算"
                                 "（decode_layer.c）；提示词：PyTorch 的 bf16 算子{threads}"),
    "engine.no_bf16_step_weights": "bf16 引擎的 C 步骤只读取 bf16 或 int8 权重",
    "engine.calibrated_bf16": "加载时校准，一个解码步：{weights} 权重上的 C 步骤 {c} ms，PyTorch 的 bf16 算子 {torch} ms",
    "engine.calibrated_torch_bf16": "加载时 PyTorch 的 bf16 算子更快",
    "engine.why_decode_ops_off": "decode_ops.c 未启用：{why}",
    "engine.decode_not_cpu": "融合的 C 路径只用于 CPU 上的 fp32",
    "engine.why_hybrid": "（混合模型：每个 KV 缓存组的层读自己的池）",
    "engine.decode_hybrid": "融合的 C 路径只用于所有层都做全注意力的模型",
    "engine.no_dense_weights": "没有稠密的 fp32 权重",
    "engine.one_thread": "；单线程（编译时没有 OpenMP：{why}）",
    "engine.linear_gemv": "1–{rows} 行的解码批次用 gemv.c，更多行用 oneDNN（预打包）{threads}",
    "engine.linear_onednn": "oneDNN（预打包）；gemv.c 未启用：{why}",
    "engine.linear_default": "PyTorch 默认实现（nn.Linear）",
    "engine.linear_quantized": "{method} 权重（PyTorch 的仅权重量化内核），共 {n} 层",
    "engine.linear_quantized_padded": "{method} 权重（PyTorch 的仅权重量化内核），共 {n} 层（其中 {padded} 层补齐到"
                                      "内核要求的宽度）",
    "engine.decode_quantized": "融合的 C 路径以 fp32 或 bf16 运行",
    "engine.decode_calibrated": "加载时校准，一个解码步：C 内核 {c} ms，PyTorch 算子 + oneDNN 线性层 {onednn} ms{mkl}",
    "engine.calibrated_int8": "加载时校准，一个解码步：int8 权重上的 C 内核 {gemv} ms，逐层用 PyTorch 的 int8 内核 {torch} ms{rows}",
    "engine.calibrated_torch_int8": "加载时 PyTorch 的 int8 内核更快",
    "engine.calibrated_rows": "加载时 int8 解码行用 {kernel} 更快",
    "engine.calibrated_int4": "加载时校准，一个解码步：int4 权重上的 C 内核 {c}，逐层用 PyTorch 的 int4 内核 {torch} ms"
                              "{lm_head}",
    "engine.calibrated_int4_rows": "；int8 lm_head 的解码行用 PyTorch 的 int8 内核 {torch} ms{rows}；采用：{kernel}",
    "engine.calibrated_torch_int4": "加载时 PyTorch 的 int4 内核更快",
    "engine.rows_times": "；逐层用 gemv_int8.c {gemv}，用 fbgemm 的动态 int8 线性层 {fbgemm}",
    "engine.rows_ms": "用时 {ms} ms",
    "engine.rows_skipped": "未采用：{why}",
    "engine.rows_torch": "PyTorch 的 int8 内核",
    "engine.rows_gemv": "gemv_int8.c（手写内核）",
    "engine.rows_fbgemm": "fbgemm 的动态 int8 线性层",
    "engine.calibrated_mkl_ms": "，PyTorch 算子 + nn.Linear（MKL）{ms} ms",
    "engine.calibrated_onednn": "PyTorch 算子 + oneDNN 线性层",
    "engine.calibrated_mkl": "PyTorch 算子 + nn.Linear（MKL）",
    "engine.dtype_checkpoint": "auto：检查点保存时的数据类型，{dtype}",
    "engine.dtype_checkpoint_fp16": "auto：检查点以 float16 保存，在 CPU 上按 bfloat16 运行",
    "engine.dtype_checkpoint_other": "auto：检查点以 {dtype} 保存，在 CPU 上按 float32 运行",
    "engine.dtype_unsaved": "auto：检查点未写明数据类型，用 float32",
    "engine.dtype_quantized": "auto：{method} 权重在 fp32 下配融合 C 算子最快（矩阵乘的输入为 bf16）",
    "engine.no_cuda": "这个 torch 构建看不到 CUDA GPU",
    "engine.no_mps": "Apple Metal（MPS）只在 Apple 芯片的 Mac 上可用",
}
if set(ENGINE_ZH) != set(WORDS):  # a sentence the engine added or dropped: its Chinese here too
    raise ValueError(f"engine words without Chinese, or not the engine's: {sorted(set(ENGINE_ZH) ^ set(WORDS))}")
MESSAGES.update({key: (WORDS[key], zh) for key, zh in ENGINE_ZH.items()})
