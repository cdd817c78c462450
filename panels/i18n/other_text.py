"""Messages of the anatomy and cache-inspector tabs and the KV-event watcher (their controls and introductions).
id -> (English, 简体中文)."""

MESSAGES = {
    "anat.intro": ("How a request becomes what the engine stores: the image cut into patches and merged into tokens, "
                   "the prompt as tokens in KV blocks, each image token's M-RoPE position, and what goes into each "
                   "block's prefix-cache key under A, B and C. Nothing runs the model.",
                   "一个请求如何变成引擎存储的内容：图片被切成图块（patch）并合并成 token，提示词作为 token 放进 KV 块，"
                   "每个图像 token 的 M-RoPE 位置，以及在 A、B、C 三种策略下每个块的前缀缓存键由什么组成。这里不运行模型。"),
    "anat.image": ("Image", "图片"),
    "anat.other": ("Second image, to compare keys (empty = the same image)", "第二张图片，用来比较键（留空 = 同一张图片）"),
    "anat.prompt": ("Prompt (the same for both)", "提示词（两者相同）"),
    "anat.show": ("Show anatomy", "显示剖析"),
    "anat.from_chat": ("Use the chat's last request", "使用对话中的最后一个请求"),
    "anat.examples": ("Examples", "示例"),
    "anat.summary": ("Anatomy summary", "剖析摘要"),
    "anat.grid": ("1 · the image as the vision tower sees it", "1 · 视觉塔眼中的图片"),
    "anat.rope": ("2 · positions of the image tokens (M-RoPE t, h, w; or 1-D)", "2 · 图像 token 的位置（M-RoPE t、h、w；或一维）"),
    "anat.strip": ("3 · the prompt as tokens, in KV blocks", "3 · 提示词的 token，放在 KV 块中"),
    "anat.keys": ("4 · prefix-cache keys per block under A, B and C", "4 · A、B、C 策略下每个块的前缀缓存键"),
    "anat.which_image": ("{knob} (image)", "{knob}（图片）"),
    "anat.which_second": ("{knob} (second image)", "{knob}（第二张图片）"),
    "anat.image_line": ("{kind} {n}: {w}×{h} px → {tokens} tokens", "{kind} {n}：{w}×{h} 像素 → {tokens} 个 token"),
    "anat.no_image": ("no image", "没有图片"),
    "anat.kind.image": ("image", "图片"), "anat.kind.video": ("video", "视频"),
    "anat.describe": ("**{n} prompt tokens** = {text} text + {image} image ({images}) · **{blocks} KV blocks** of "
                      "{bs} ({full} full and keyed; {unused} unused slots in the last) · drawn in {secs} s",
                      "**提示词共 {n} 个 token** = {text} 个文本 + {image} 个图像（{images}）· **{blocks} 个 KV 块**，"
                      "每块 {bs} 个（{full} 个已满并有键；最后一块有 {unused} 个空槽位）· 绘制用时 {secs} 秒"),
    "anat.note": ("<br>note: {note}", "<br>注：{note}"),
    "anat.chat_empty": ("The chat is empty: send a message in the Chat tab first.", "对话是空的：请先在“对话”页签发送一条消息。"),
    # anatomy figures and key table
    "anat.grid_note": ("image {k}: {ow}×{oh} → {rw}×{rh} · {gw}×{gh} patches of {patch} px · {m}×{m} merge → "
                       "{cols}×{rows} = {n} tokens",
                       "图片 {k}：{ow}×{oh} → {rw}×{rh} · {gw}×{gh} 个 {patch} 像素的图块 · {m}×{m} 合并 → "
                       "{cols}×{rows} = {n} 个 token"),
    "anat.grid_legend": ("<br><sup>white: patch edges · yellow: merge groups (one group = one token)</sup>",
                         "<br><sup>白线：图块边界 · 黄线：合并组（一组 = 一个 token）</sup>"),
    "anat.grid_hover": ("image {k} · token {i} · merged cell (row {row}, col {col})",
                        "图片 {k} · token {i} · 合并单元（第 {row} 行，第 {col} 列）"),
    "anat.block_label": ("block {i}", "块 {i}"),
    "anat.partial": (" · {n}/{bs}, not keyed yet", " · {n}/{bs}，尚无键"),
    "anat.strip_title": ("{n} tokens ({text} text, {image} image) in {blocks} KV blocks of {bs} · purple: special "
                         "tokens · grey: empty slots of the last block",
                         "{n} 个 token（{text} 个文本，{image} 个图像），放在 {blocks} 个每块 {bs} 个的 KV 块里 · 紫色：特殊 "
                         "token · 灰色：最后一块的空槽位"),
    "anat.rope_none": ("No image: every token's (t, h, w) is (i, i, i), plain 1-D RoPE",
                       "没有图片：每个 token 的 (t, h, w) 都是 (i, i, i)，即普通的一维 RoPE"),
    "anat.rope_axis": ("image {k}: {axis}", "图片 {k}：{axis}"),
    "anat.rope_tail": ("; the text after it resumes at {n}", "；它之后的文本从 {n} 继续"),
    "anat.rope_image": ("image {k} starts at {start}{tail}", "图片 {k} 从 {start} 开始{tail}"),
    "anat.rope_title": ("{images}<br><sup>generated token i then gets position {offset} on all "
                        "three axes (the rope delta)</sup>",
                        "{images}<br><sup>之后生成的第 i 个 token 在三个轴上的位置都是 {offset}"
                        "（rope delta）</sup>"),
    # Gemma 3's fixed image kind (panels/anatomy_fixed.py)
    "anat.fixed_note": ("image {k}: {ow}×{oh} px → {views} view{s} of {size}×{size} px{cut}<br>each: {patches}×"
                        "{patches} patches of {patch} px, pooled {pool}×{pool} → {side}×{side} = {per} soft tokens · "
                        "{views} × {per} = {n}",
                        "图片 {k}：{ow}×{oh} 像素 → {views} 个 {size}×{size} 像素的视图{cut}<br>每个：{patches}×{patches} "
                        "个 {patch} 像素的图块，{pool}×{pool} 池化 → {side}×{side} = {per} 个软 token · {views} × {per} "
                        "= {n}"),
    "anat.fixed_off": (" (whole, squashed; pan-and-scan off)", "（整张压扁；pan-and-scan 关闭）"),
    "anat.fixed_not_cut": (" (whole; not cut: a crop needs ratio {ratio}, {least} px)",
                           "（整张；没有切：裁剪需要长宽比 {ratio}、{least} 像素）"),
    "anat.fixed_crops": (": the whole, then {n} pan-and-scan crops ({rows}×{cols})",
                         "：整张，然后是 {n} 个 pan-and-scan 裁剪块（{rows}×{cols}）"),
    "anat.fixed_legend": ("<br><sup>white: patches · yellow: pooled groups = soft tokens (each view's between "
                          "&lt;start_of_image&gt; and &lt;end_of_image&gt;) · red: crops</sup>",
                          "<br><sup>白线：图块 · 黄线：池化组 = 软 token（每个视图的位于 &lt;start_of_image&gt; 与 "
                          "&lt;end_of_image&gt; 之间）· 红框：裁剪块</sup>"),
    "anat.knob_patches": ("max_pixels (one step = one token = {px} px)", "max_pixels（每格 = 一个 token = {px} 像素）"),
    "anat.knob_crops": ("max_patches (crops)", "max_patches（裁剪块数）"),
    "anat.knob_tiles": ("size: longest edge before tiling (px)", "size：切块前的最长边（像素）"),
    "anat.budget_knob": ("max_soft_tokens: 0-4 for {budgets} soft tokens per image at most",
                         "max_soft_tokens：0-4 对应每张图最多 {budgets} 个软 token"),
    "anat.fixed_knob": ("do_pan_and_scan: 0 off, 1 on (a long image is also cut into crops)",
                        "do_pan_and_scan：0 关，1 开（长图片还会被切成裁剪块）"),
    "keys.what.A": ("token ids only", "只有 token id"), "keys.what.B": ("+ image content hash", "+ 图像内容哈希"),
    "keys.what.C": ("+ grid or tiling, processor settings, offset, model", "+ 网格或切片、预处理设置、偏移、模型"),
    "keys.block": ("block {i}<br><span style='{style}'>tokens {first}–{last}<br>{kind}</span>",
                   "块 {i}<br><span style='{style}'>token {first}–{last}<br>{kind}</span>"),
    "keys.add_second": ("Add a second image to compare two requests block by block.", "添加第二张图片，逐块比较两个请求。"),
    "keys.request": ("request {n}", "请求 {n}"),
    "keys.compare": ("Each key of <b>{a}</b> next to <b>{b}</b>'s: {same_open}green</span> = the same key, so {b} "
                     "would be served {a}'s cached block; {diff_open}red</span> = a different key. {mark}Highlighted"
                     "</mark>: the inputs that differ ({a} ≠ {b}).",
                     "<b>{a}</b> 的每个键与 <b>{b}</b> 的对照：{same_open}绿色</span> = 键相同，所以 {b} 会拿到 {a} 缓存的块；"
                     "{diff_open}红色</span> = 键不同。{mark}高亮</mark>：两者不同的输入（{a} ≠ {b}）。"),
    "keys.intro": ("This engine keys its prefix cache with strategy <b>{strategy}</b>. A key = sha256(parent key, the "
                   "block's token ids, extra). {note}",
                   "本引擎的前缀缓存使用策略 <b>{strategy}</b> 计算键。键 = sha256(父块的键, 本块的 token id, 额外信息)。{note}"),
    "insp.intro": ("Runs request 1 then request 2 on a fresh **isolated** KV pool per strategy (the loaded weights are "
                   "shared, the app's own cache is never touched), and request 2 once more with no cache at all. "
                   "A **false hit** reuses a block whose KV was computed from different content. A true hit's logprobs "
                   "differ from the cold run's by float rounding at most: exactly 0, or about 1e-6 when the cached "
                   "run's differently shaped matrix products (it computes just the uncached tail) round differently; "
                   "a false hit's differ by whole units. The last column says which.",
                   "每种策略各用一个全新的**隔离** KV 池，先运行请求 1 再运行请求 2（共享已加载的权重，从不触碰应用自己的"
                   "缓存），再在完全没有缓存的情况下运行一次请求 2。**误命中**是指复用了一个由不同内容算出 KV 的块。真命中的"
                   " logprob 与冷启动运行相比最多相差浮点舍入：正好为 0，或约 1e-6（缓存运行只计算未缓存的尾部，矩阵乘法形状"
                   "不同，舍入也就不同）；误命中则相差整数量级。最后一列说明属于哪一种。"),
    "insp.img1": ("Image 1", "图片 1"),
    "insp.hybrid_note": ("what key A's false hit also restored", "键 A 的误命中还恢复了什么"),
    "insp.img2": ("Image 2", "图片 2"),
    "insp.resize1": ("resize / tiling of image 1", "图片 1 的缩放 / 切片"),
    "insp.resize2": ("resize / tiling of image 2", "图片 2 的缩放 / 切片"),
    "insp.prompt": ("Prompt", "提示词"),
    "insp.prompt2": ("Prompt for request 2 (empty = the same)", "请求 2 的提示词（留空 = 相同）"),
    "insp.max_tokens": ("max tokens", "最大 token 数"),
    "insp.run": ("Run A / B / C", "运行 A / B / C"),
    "insp.results": ("Per strategy", "各策略结果"),
    "insp.blocks": ("Which blocks were reused", "哪些块被复用了"),
    "preset.Same text, different image": ("Same text, different image", "文字相同，图片不同"),
    "preset.Identical": ("Identical", "完全相同"),
    "preset.Same image, different text": ("Same image, different text", "图片相同，文字不同"),
    "preset.Same image, different resize": ("Same image, different resize", "图片相同，缩放不同"),
    "preset.Same image, different tiling": ("Same image, different tiling", "图片相同，切片不同"),
    "preset.Same video, different fps": ("Same video, different fps", "视频相同，帧率不同"),
    "preset.Hybrid model: same text, different image": ("Hybrid model (Qwen3.5, Gemma 3): same text, different "
                                                        "image", "混合模型（Qwen3.5、Gemma 3）：文字相同，图片不同"),
    "insp.what_state": ("its recurrent layers resume from the state saved at the hit's last token",
                        "它的循环层从命中末尾 token 处保存的状态继续"),
    "insp.what_window": ("its sliding-window layers reuse the blocks of the window before the hit's last token",
                         "它的滑动窗口层复用命中末尾 token 之前窗口内的块"),
    "insp.restored_state": (" and the recurrent state at token {n}", "以及第 {n} 个 token 处的循环状态"),
    "insp.restored_window": (" and the sliding-window blocks before token {n}", "以及第 {n} 个 token 之前的滑动窗口块"),
    "insp.hybrid_random": ("a random-weight Qwen3.5 test checkpoint (the served model has one KV-cache group; its "
                           "answers are noise, its hits and drift are the lesson)",
                           "一个随机权重的 Qwen3.5 测试检查点（所服务的模型只有一个 KV 缓存组；它的回答是噪声，命中和偏差才是"
                           "要点）"),
    "insp.hybrid_served": ("the served {model}", "所服务的 {model}"),
    "insp.hybrid_note": ("**Hybrid model** · ran on {where}. A hybrid model's prefix hit restores more than the "
                         "full-attention K/V: {what}. Under **A** request 2 hit {hits} blocks ({false} false, {n} "
                         "tokens): their K/V{restored} were computed from image 1, and every later token reads them. "
                         "Missed: {others}: their keys hold the image.",
                         "**混合模型** · 运行于{where}。混合模型的前缀命中恢复的不只是全注意力的 K/V：{what}。在 **A** 下"
                         "请求 2 命中了 {hits} 个块（误命中 {false} 个，{n} 个 token）：它们的 K/V{restored}都是由图片 1 "
                         "算出的，之后每个 token 都会读到它们。未命中：{others}：它们的键包含图片。"),
    "insp.col.strategy": ("strategy", "策略"), "insp.col.hits": ("hits", "命中"), "insp.col.true": ("true hits", "真命中"),
    "insp.col.false": ("false hits", "误命中"), "insp.col.cached": ("cached tokens", "缓存 token 数"),
    "insp.col.answer1": ("answer · image 1", "回答 · 图片 1"), "insp.col.answer2": ("answer · image 2", "回答 · 图片 2"),
    "insp.col.cold": ("cold answer · image 2", "冷启动回答 · 图片 2"),
    "insp.col.drift": ("max |Δlogprob| vs cold", "与冷启动相比最大 |Δlogprob|"),
    "insp.col.meaning": ("so the drift is", "所以这个偏差是"),
    "insp.bit_identical": ("none: bit-identical", "没有：逐位相同"),
    "insp.rounding": ("float rounding only", "只是浮点舍入"),
    "insp.not_this": ("the reused KV was not this request's", "复用的 KV 不是这个请求的"),
    "insp.miss": ("miss", "未命中"), "insp.true_hit": ("true hit", "真命中"), "insp.false_hit": ("false hit", "误命中"),
    "insp.hover_state.0": ("miss", "未命中"), "insp.hover_state.1": ("true hit", "真命中"),
    "insp.hover_state.2": ("FALSE hit", "误命中"),
    "insp.hover": ("{name}: logical block L{i} · {state}", "{name}：逻辑块 L{i} · {state}"),
    "insp.reused": (" · reused physical block {label}", " · 复用了物理块 {label}"),
    "insp.title": ("Request 2's prompt blocks by logical index L; #id = the physical block it reused",
                   "请求 2 的提示词块，按逻辑序号 L 排列；#id = 它复用的物理块"),
    "insp.axis": ("logical block of request 2", "请求 2 的逻辑块"),
    "insp.two_images": ("Give two images (upload them or pick a preset).", "请给出两张图片（上传或选一个预设）。"),
    "insp.give_prompt": ("Give a prompt.", "请输入提示词。"),
    "insp.text_only": ("{model} is a text-only model: the inspector compares requests with images.",
                       "{model} 是纯文本模型：缓存检查比较的是带图片的请求。"),
    "watch.accordion": ("Watch a KV-event stream (vLLM, SGLang, another minivlm)",
                        "观察一个 KV 事件流（vLLM、SGLang 或另一个 minivlm）"),
    "watch.target": ("publisher: tcp://host:port[#topic]", "发布端：tcp://host:port[#topic]"),
    "watch.replay": ("replay endpoint (optional)", "回放端点（可选）"),
    "watch.go": ("Watch", "观察"),
    "watch.status": ("watched stream: counters", "所观察的事件流：计数"),
    "watch.tree": ("Prefix tree drawn from the watched stream", "根据所观察的事件流画出的前缀树"),
    "watch.idle": ("Not watching. Enter a publisher's address (e.g. `tcp://vllm-host:5557#kv-events`) and press Watch.",
                   "尚未观察。输入发布端的地址（例如 `tcp://vllm-host:5557#kv-events`）再按“观察”。"),
    # the watched stream's state (minivlm.kv_events.watcher: KVEventWatcher.state), first line of the status
    "watch.state.no_publisher": ("⏳ **waiting**: nothing is listening at `{endpoint}` yet ({attempts} connection "
                                 "attempts in {waited}; the watcher keeps trying)",
                                 "⏳ **等待中**：`{endpoint}` 上还没有发布端在监听（{waited} 内尝试连接 {attempts} "
                                 "次；观察器会继续尝试）"),
    "watch.state.waiting": ("⏳ **connected, waiting**: no data yet ({waited} since the watch began; an idle engine "
                            "publishes nothing)",
                            "⏳ **已连接，等待中**：尚无数据（观察已开始 {waited}；空闲的引擎不发布任何内容）"),
    "watch.state.receiving": ("🟢 **connected**: receiving · last batch {ago} ago, at {at}",
                              "🟢 **已连接**：正在接收 · 最近一批在 {ago} 前（{at}）到达"),
    "watch.state.quiet": ("🟡 **connected, no data for {ago}** · last batch at {at} (an idle engine publishes nothing)",
                          "🟡 **已连接，{ago} 没有数据** · 最近一批在 {at} 到达（空闲的引擎不发布任何内容）"),
    "watch.state.gone": ("🔴 **publisher gone**: disconnected {since} ago · no data for {ago} · last batch at {at} "
                         "(the watcher reconnects when it comes back)",
                         "🔴 **发布端已离开**：{since} 前断开 · {ago} 没有数据 · 最近一批在 {at} 到达（它回来时观察器"
                         "会重新连接）"),
    "watch.state.decode_errors": ("🔴 **decode errors**: the last {n} message{s} could not be decoded (not a KV-event "
                                  "stream, or a dialect minivlm does not read) · last batch at {at}",
                                  "🔴 **解码错误**：最近 {n} 条消息无法解码（不是 KV 事件流，或是 minivlm 读不懂的格式）"
                                  " · 最近一批在 {at} 到达"),
    "watch.never": ("never", "从未"),
    "watch.seconds": ("{n} s", "{n} 秒"),
    "watch.minutes": ("{m} min", "{m} 分钟"),
    "watch.watching": ("**Watching** `{endpoint}` {topic}, {replay}", "**正在观察** `{endpoint}` {topic}，{replay}"),
    "watch.topic": ("topic `{topic}`", "主题 `{topic}`"),
    "watch.every_topic": ("(every topic)", "（所有主题）"),
    "watch.replay_at": ("replay `{endpoint}`", "回放 `{endpoint}`"),
    "watch.no_replay": ("no replay socket", "没有回放端点"),
    "watch.counters": ("batches {batches} (last seq {seq}) · events: {events} · {blocks} blocks cached, {images} with "
                       "images",
                       "批次 {batches}（最近序号 {seq}）· 事件：{events} · 已缓存 {blocks} 个块，其中 {images} 个带图片"),
    "watch.stream": ("gaps {gaps} missed batches, {recovered} recovered by replay · publisher restarts {restarts} · "
                     "decode errors: {errors} · dialect: {dialects}",
                     "缺口：漏掉 {gaps} 批，回放找回 {recovered} 批 · 发布端重启 {restarts} 次 · 解码错误：{errors} · "
                     "格式：{dialects}"),
    "watch.none": ("none", "无"),
    "watch.none_yet": ("none yet", "尚无"),
    "watch.joined": ("joined a running stream at seq {seq}: blocks stored before are not shown",
                     "从序号 {seq} 起加入一个正在进行的事件流：之前存入的块不会显示"),
    "watch.last_problem": ("last problem: {error}", "最近的问题：{error}"),
    "watch.recent": ("recent: {items}", "最近：{items}"),
    "watch.refused": ("refused: {error}", "已拒绝：{error}"),
    "watch.shared": ("a shared deployment watches only what its operator set with --watch-kv-events",
                     "共享部署只观察运维者用 --watch-kv-events 设定的地址"),
}
