"""Messages of the Roofline tab (panels/roofline.py): its inputs, the machine's bound, the figure, the table and one
sentence per point. id -> (English, 简体中文)."""

MESSAGES = {
    "tab.roofline": ("Roofline", "屋顶线"),
    "roof.intro": ("What one engine step must read and compute (the VRAM calculator's byte counts), against what this "
                   "machine can do (its copy bandwidth and matmul rate, measured here): the classic roofline. A point "
                   "under the sloped line is bound by memory, under the flat one by arithmetic.",
                   "引擎每一步必须读取和计算的量（与显存计算器同一套字节数），对比本机能做到的（在此实测的拷贝带宽与矩阵乘速率）："
                   "经典的屋顶线图。斜线下的点受内存带宽限制，平线下的点受算力限制。"),
    "roof.model": ("Model", "模型"),
    "roof.dtype": ("weights dtype (a preset)", "权重 dtype（预设模型）"),
    "roof.measure": ("Measure this engine's steps", "实测本引擎的各步"),
    "roof.plot": ("Roofline", "屋顶线"),
    "roof.table": ("What each step reads and computes", "每一步读取和计算的量"),
    "roof.machine_label": ("This machine's bandwidth and FLOP rate", "本机的带宽与算力"),
    "roof.note_label": ("About these points", "关于这些点"),
    "roof.image_label": ("What one image costs the tower", "一张图片在视觉塔上的开销"),
    "roof.sentences": ("Each point, checked by hand", "逐点手算核对"),
    "roof.machine": ("**This machine** ({device}, {dtype}): copy bandwidth **{gbs} GB/s** (bytes read + written, "
                     "best of {copies} runs), matmul **{gflops} GFLOP/s** (best of {products}); measured in {secs} s, "
                     "once per process. Ridge point: {ridge} FLOPs per byte.",
                     "**本机**（{device}，{dtype}）：拷贝带宽 **{gbs} GB/s**（读 + 写的字节，{copies} 次中最快），矩阵乘 "
                     "**{gflops} GFLOP/s**（{products} 次中最快）；用时 {secs} 秒测得，每个进程测一次。拐点：每字节 {ridge} "
                     "次浮点运算。"),
    "roof.predicted_note": ("**Predicted only** ({model}, {dtype}: not loaded, nothing run): each point sits on its "
                            "ceiling at this machine's bound.",
                            "**仅为预测**（{model}，{dtype}：未加载，未运行）：每个点都画在本机上限的屋顶上。"),
    "roof.engine_note": ("This engine's model, not measured yet: the points are predicted. **Measure** runs batches of "
                         "1, 4 and 16 text requests at a short and a long context on an isolated pool of the loaded "
                         "weights, and reads each step's time from the engine's event log.",
                         "本引擎的模型，尚未实测：图上的点是预测值。**实测**会在加载好的权重上另建一个隔离的缓存池，"
                         "以 1、4、16 个文本请求、短和长两种上下文运行，并从引擎的事件日志读出每一步的用时。"),
    "roof.measured_note": ("Measured on this engine: {n} points from {steps} timed steps (the `scheduled` events' "
                           "started / ended).",
                           "在本引擎上实测：{n} 个点，来自 {steps} 个计时的步（`scheduled` 事件的 started / ended）。"),
    "roof.no_times": ("No step came back timed (a run too long for the measuring budget, or a log without step "
                      "times): nothing to place.",
                      "没有带时间的步（运行太长、超出测量预算，或日志里没有步的时间）：没有可画的点。"),
    "roof.kind.decode": ("decode", "解码"),
    "roof.kind.prefill": ("prefill", "预填充"),
    "roof.kind.mixed": ("mixed", "混合"),
    # one sentence per point: what it reads, the bound that sets, the time taken
    "roof.say_memory": ("a {n}-request {kind} step at {ctx} tokens of context reads {mb} MB; at {gbs} GB/s that is at "
                        "best {best} ms",
                        "一个 {n} 请求的{kind}步、上下文 {ctx} token，读取 {mb} MB；按 {gbs} GB/s 计算，最快 {best} ms"),
    "roof.say_compute": ("a {n}-request {kind} step of {tokens} tokens computes {gflop} GFLOP; at {gflops} GFLOP/s "
                         "that is at best {best} ms",
                         "一个 {n} 请求的{kind}步、共 {tokens} 个 token，计算 {gflop} GFLOP；按 {gflops} GFLOP/s 计算，"
                         "最快 {best} ms"),
    "roof.say_took": ("; it took {took} ms ({pct} % of the bound)", "；实际用时 {took} ms（达到上限的 {pct} %）"),
    "roof.say_predicted": (" (predicted: not run)", "（预测值：未运行）"),
    "roof.above": ("A step over 100 % of its bound ran while the machine was quieter than when the bound was measured "
                   "(other programs share its cores): measure again.",
                   "有的步超过了上限的 100 %：测上限时机器比运行这一步时更忙（其他程序也在用这些核心）。请再实测一次。"),
    "roof.image": ("One {w}×{h} image through the vision tower: {patches} patches, weights {weights} MB + activations "
                   "{acts} MB, {gflop} GFLOP: at best {best} ms on this machine.",
                   "一张 {w}×{h} 的图片经过视觉塔：{patches} 个 patch，权重 {weights} MB + 激活 {acts} MB，{gflop} GFLOP："
                   "在本机最快 {best} ms。"),
    "roof.text_only": ("A text-only model: no vision tower.", "纯文本模型：没有视觉塔。"),
    # the figure
    "roof.fig_title": ("{model}: steps on the roofline of {device}", "{model}：{device} 屋顶线上的各步"),
    "roof.fig_x": ("arithmetic intensity (FLOPs per byte read)", "算术强度（每读取一字节的浮点运算数）"),
    "roof.fig_y": ("GFLOP/s", "每秒十亿次浮点运算（GFLOP/s）"),
    "roof.fig_roof": ("roof: bandwidth × intensity, at most the FLOP rate", "屋顶：带宽 × 强度，至多算力"),
    "roof.fig_measured": ("{kind} (measured)", "{kind}（实测）"),
    "roof.fig_predicted": ("{kind} (predicted, on its ceiling)", "{kind}（预测，位于其上限）"),
    "roof.fig_ceiling": ("each point's ceiling", "每个点的上限"),
    # the table's columns
    "roof.col.step": ("step", "步"),
    "roof.col.requests": ("requests", "请求数"),
    "roof.col.context": ("context", "上下文"),
    "roof.col.decoder": ("decoder weights MB", "解码器权重 MB"),
    "roof.col.head": ("LM head MB", "输出层（LM head）MB"),
    "roof.col.kv": ("KV reads MB", "KV 读取 MB"),
    "roof.col.state": ("recurrent state MB", "循环状态 MB"),
    "roof.col.total": ("total MB", "合计 MB"),
    "roof.col.gflop": ("GFLOP", "浮点运算 GFLOP"),
    "roof.col.intensity": ("FLOPs/byte", "FLOPs/字节"),
    "roof.col.bound": ("bound ms", "上限 ms"),
    "roof.col.took": ("took ms", "用时 ms"),
    "roof.col.pct": ("% of bound", "达到上限 %"),
}
