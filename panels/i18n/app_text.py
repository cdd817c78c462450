"""Messages of the page around the tabs: title, language switch, tab names, the header (engine settings, status
line, rebuild notes, operator) and the refusals every tab shares. id -> (English, 简体中文)."""

MESSAGES = {
    "app.title": ("# minivlm · a paged-KV engine for vision-language models you can watch",
                  "# minivlm · 一个看得见内部运作的分页 KV（paged KV）视觉语言模型推理引擎"),
    "app.language": ("Language", "语言"),
    "tab.chat": ("Chat", "对话"),
    "tab.anatomy": ("Anatomy", "剖析"),
    "tab.kv": ("KV blocks (live)", "KV 块（实时）"),
    "tab.inspector": ("Cache inspector", "缓存检查"),
    "tab.vram": ("VRAM budget", "显存预算"),
    # header
    "header.settings": ("Engine settings: model, device, dtype, KV pool, prefix cache",
                        "引擎设置：模型、设备、dtype、KV 池、前缀缓存"),
    "header.model": ("Model", "模型"),
    "header.model_info": ("the shipped tiny model, a local HF checkpoint dir, or a hub id (downloads on demand)",
                          "随附的微型模型、本地 HF 检查点目录，或 Hub 上的模型 id（按需下载）"),
    "header.device": ("Device", "设备"),
    "header.strategy": ("Prefix cache", "前缀缓存"),
    "header.strategy_info": ("A: token ids · B: + image hash · C: + processor, grid, model",
                             "A：token id · B：+ 图像哈希 · C：+ 预处理器、网格、模型"),
    "header.strategy_info_shared": ("shared deployment: C + a cache salt per session",
                                    "共享部署：C + 每个会话一个缓存盐（cache salt）"),
    "header.dtype": ("dtype", "数据类型（dtype）"),
    "header.block_size": ("block size (tokens)", "块大小（token 数）"),
    "header.num_blocks": ("KV blocks (0 = from memory)", "KV 块数（0 = 按内存计算）"),
    "header.token": ("operator token", "运维口令"),
    "header.token_info": ("shared deployment: the settings belong to the operator; press Enter to unlock",
                          "共享部署：设置归运维者所有；输入口令后按回车解锁"),
    "header.rebuild": ("Rebuild engine", "重建引擎"),
    "header.status": ("engine status", "引擎状态"),
    "header.cost": ("what a rebuild ends", "重建会终止什么"),
    "header.operator": ("operator", "运维"),
    "header.device_info": ("auto = cuda > mps > cpu (the shipped tiny model: cuda > cpu); mps is less tested. {reasons}",
                           "auto = cuda > mps > cpu（随附的微型模型：cuda > cpu）；mps 测试较少。{reasons}"),
    "header.all_devices": ("every device kind is available", "所有设备类型都可用"),
    "header.status_line": (
        "**{model}** ({model_type}) on **{device}** ({dtype}) · weights {weights_mib} MiB · KV cache: {blocks} "
        "blocks × {block_size} = **{tokens} tokens** ({kv_mib} MiB){groups} · maximum concurrency for {max_len} "
        "tokens per request: **{concurrency}x** · prefix cache: {strategy} · attention: {attention} · matrix products: "
        "{linear} · decode layers: {decode}",
        "**{model}**（{model_type}）运行于 **{device}**（{dtype}）· 权重 {weights_mib} MiB · KV 缓存：{blocks} 块 × "
        "{block_size} = **{tokens} 个 token**（{kv_mib} MiB）{groups}· 每请求 {max_len} 个 token 时的最大并发："
        "**{concurrency}x** · 前缀缓存：{strategy} · 注意力：{attention} · 矩阵乘：{linear} · 解码层：{decode}"),
    "header.speculation": (" · speculative decoding: {method} (prompt lookup), up to {k} guessed tokens a step, "
                           "matching the last {lookup} tokens",
                           " · 推测解码：{method}（提示查找），每步最多猜 {k} 个 token，匹配最近 {lookup} 个 token"),
    "header.speculation_mtp": (" · speculative decoding: mtp (the model's own multi-token-prediction head), up to {k} "
                               "guessed tokens a step",
                               " · 推测解码：mtp（模型自带的多 token 预测头），每步最多猜 {k} 个 token"),
    "header.shipped": ("{name} (shipped, offline)", "{name}（随附，离线可用）"),
    "header.hub": ("{name} (hub)", "{name}（Hub 下载）"),
    "header.unavailable_choice": ("{name} (unavailable)", "{name}（不可用）"),
    "header.less_tested": ("{name} (less tested)", "{name}（测试较少）"),
    "header.no_engine": ("no engine loaded", "尚未加载引擎"),
    "header.cost_first": ("Changing a setting builds the engine.", "修改任一设置会构建引擎。"),
    "header.cost_line": ("Changing a setting rebuilds the engine once: that ends {requests} and empties the prefix "
                         "cache ({blocks}).",
                         "修改任一设置会重建一次引擎：这会终止{requests}，并清空前缀缓存（{blocks}）。"),
    "header.cost_running": ("**{n} running request{s}** (every session's)", "**{n} 个运行中的请求**（所有会话的）"),
    "header.cost_none": ("no running request", "没有运行中的请求"),
    "header.cost_cached": ("**{n} cached block{s}**", "**{n} 个已缓存的块**"),
    "header.cost_nothing": ("nothing cached yet", "尚未缓存任何内容"),
    "header.unavailable": ("{device} is not available: {why}", "{device} 不可用：{why}"),
    "header.still_serving": ("Still serving: {status}", "仍在服务：{status}"),
    "header.loading": ("loading {model}", "正在加载 {model}"),
    "header.wrong_token": ("Wrong operator token: the header stays read-only.", "运维口令错误：设置栏保持只读。"),
    "header.wrong_token_note": ("⚠️ wrong operator token: the header stays read-only",
                                "⚠️ 运维口令错误：设置栏保持只读"),
    "header.unlocked": ("Operator: the header is unlocked for this page.", "运维：本页的设置栏已解锁。"),
    "header.unlocked_note": ("✅ operator: the header is unlocked for this page (every rebuild checks the token again)",
                             "✅ 运维：本页的设置栏已解锁（每次重建都会再次核对口令）"),
    "header.shared_refusal": ("This is a shared deployment: its engine configuration belongs to the operator and was "
                              "not changed. Operator: {how}.",
                              "这是一个共享部署：引擎配置归运维者所有，未作改动。运维者：{how}。"),
    "header.how_token": ("enter the operator token (${env}) in the header", "在设置栏输入运维口令（${env}）"),
    "header.how_restart": ("restart the app with other flags, or set ${env} to change it from the header",
                           "用其他参数重启应用，或设置 ${env} 以便在设置栏修改"),
    # a checkpoint refused before it replaces the engine (minivlm/checkpoint_check.py; the header says it)
    "error.checkpoint_unreadable": ("checkpoint {dir}: {file} is not readable JSON ({detail})",
                                    "检查点 {dir}：{file} 不是可读的 JSON（{detail}）"),
    "error.checkpoint_missing_file": ("checkpoint {dir} is missing {file} (its weights index lists it): copy the whole "
                                      "checkpoint again",
                                      "检查点 {dir} 缺少 {file}（权重索引列出了它）：请重新完整复制检查点"),
    "error.checkpoint_no_weights": ("checkpoint {dir} has no *.safetensors weights",
                                    "检查点 {dir} 没有 *.safetensors 权重文件"),
    "error.checkpoint_corrupt_weights": ("corrupt weights file {file} in checkpoint {dir}: {detail}",
                                         "检查点 {dir} 中的权重文件 {file} 已损坏：{detail}"),
    "error.checkpoint_missing_layers": ("the weights of checkpoint {dir} do not cover its config.json: {count} of its "
                                        "{n} decoder layers (layer {layers}) are missing from its *.safetensors files",
                                        "检查点 {dir} 的权重与其 config.json 不符：{n} 个解码层中缺少 {count} 个（第 "
                                        "{layers} 层），*.safetensors 文件不完整"),
    "error.checkpoint_no_embedding": ("the weights of checkpoint {dir} have no token embedding (embed_tokens): its "
                                      "*.safetensors files are incomplete",
                                      "检查点 {dir} 的权重中没有词嵌入（embed_tokens）：*.safetensors 文件不完整"),
    "error.checkpoint_embedding_shape": ("the token embedding of checkpoint {dir} has {rows} rows where its "
                                         "config.json says vocab_size {vocab}: the weights are not this config's",
                                         "检查点 {dir} 的词嵌入有 {rows} 行，而 config.json 的 vocab_size 为 {vocab}："
                                         "权重与这个配置不符"),
    "error.checkpoint_no_tokenizer": ("checkpoint {dir} has no tokenizer: {file} is missing (and no tokenizer.model, "
                                      "nor vocab.json + merges.txt); copy the tokenizer files from the model's hub "
                                      "page",
                                      "检查点 {dir} 没有分词器：缺少 {file}（也没有 tokenizer.model 或 vocab.json + "
                                      "merges.txt）；请从模型的 Hub 页面复制分词器文件"),
    "error.checkpoint_small_vocab": ("the tokenizer of checkpoint {dir} ({file}) has {n} tokens where its config.json "
                                     "says vocab_size {vocab}: it is empty or not this model's tokenizer",
                                     "检查点 {dir} 的分词器（{file}）只有 {n} 个 token，而 config.json 的 vocab_size "
                                     "为 {vocab}：分词器为空，或不是这个模型的分词器"),
    "error.checkpoint_no_chat_template": ("checkpoint {dir} has no chat template: {file} is missing (nor "
                                          "chat_template.json, nor a chat_template in tokenizer_config.json)",
                                          "检查点 {dir} 没有对话模板：缺少 {file}（也没有 chat_template.json，"
                                          "tokenizer_config.json 里也没有 chat_template）"),
    "error.checkpoint_no_processor": ("checkpoint {dir} has no image processor settings: {file} is missing (nor an "
                                      "image_processor in processor_config.json)",
                                      "检查点 {dir} 没有图像处理器设置：缺少 {file}（processor_config.json 里也没有 "
                                      "image_processor）"),
    "error.checkpoint_processor": ("the processor of checkpoint {dir} could not be loaded: {detail}",
                                   "无法加载检查点 {dir} 的处理器：{detail}"),
}
