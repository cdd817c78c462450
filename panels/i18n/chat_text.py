"""Messages of the chat tab, and the engine's refusals a person meets there (error.<reason>: each English text is the
engine's own sentence with {fields}; panels/i18n/errors.py fills the Chinese from the refusal's fields).
id -> (English, 简体中文)."""

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
    "chat.example_aria": ("Example", "示例"),
    "chat.picture_aria": ("picture", "图片"),
    # the engine's refusals, error.<reason> (minivlm.Refused): said again from the refusal's fields; the English is
    # the engine's own sentence (tests/test_i18n.py checks it), shown as the engine wrote it on an English page
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
    "error.engine_closed": ("this engine is closed", "这个引擎已关闭（设置栏重建了引擎）"),
    "error.image_name": ("image {n}", "图片 {n}"),  # how a refusal names the n-th image or video of a request
    "error.video_name": ("video {n}", "视频 {n}"),
    # the engine's words in the status line and the device notes (engine.*: read back from their English)
    "engine.attn_inplace": ("in-place paged decode (C kernel over the block tables); prefill: SDPA",
                            "原地分页解码（直接在块表上运行的 C 内核）；预填充：SDPA"),
    "engine.attn_gathered": ("SDPA over gathered blocks{why}", "对收集起来的块做 SDPA{why}"),
    "engine.attn_flash": ("flash-attn paged kernels", "flash-attn 分页内核"),
    "engine.linear_gemv": ("gemv.c for decode batches of 1-{rows}, oneDNN (prepacked) above",
                           "1–{rows} 行的解码批次用 gemv.c，更多行用 oneDNN（预打包）"),
    "engine.linear_onednn": ("oneDNN (prepacked); gemv.c off: {why}", "oneDNN（预打包）；gemv.c 未启用：{why}"),
    "engine.linear_default": ("PyTorch's default (nn.Linear)", "PyTorch 默认实现（nn.Linear）"),
    "engine.decode_layer": ("one C call a step for 1-{rows} sequences (decode_layer.c), fused small ops (decode_ops.c) "
                            "above", "1–{rows} 个序列时每步一次 C 调用（decode_layer.c），更多序列时融合小算子（decode_ops.c）"),
    "engine.decode_ops": ("fused small ops (decode_ops.c); decode_layer.c off: {why}",
                          "融合小算子（decode_ops.c）；decode_layer.c 未启用：{why}"),
    "engine.decode_torch": ("PyTorch ops ({why})", "PyTorch 算子（{why}）"),
    "engine.decode_torch_off": ("PyTorch ops (decode_ops.c off: {why})", "PyTorch 算子（decode_ops.c 未启用：{why}）"),
    "engine.compiling": ("compiling", "正在编译"),
    "engine.decode_not_cpu": ("the fused C paths are for the CPU in fp32", "融合的 C 路径只用于 CPU 上的 fp32"),
    "engine.no_cuda": ("no CUDA GPU visible to this torch build", "这个 torch 构建看不到 CUDA GPU"),
    "engine.no_mps": ("Apple Metal (MPS) is only on Apple-silicon Macs", "Apple Metal（MPS）只在 Apple 芯片的 Mac 上可用"),
}
