"""Messages of the Timeline tab (panels/request_timeline.py and its figure): the load generator's controls, the
Gantt chart's spans and hovers, the percentile table. id -> (English, 简体中文)."""

MESSAGES = {
    "tab.timeline": ("Timeline", "时间线"),
    "tl.intro": ("Where the time goes, per request, in wall-clock time: send N image requests at R per second (three "
                 "prompt lengths in turn) to an engine of your own, twice, once without and once with the setting "
                 "you pick, and compare. Each row is a request: waiting in the queue, the vision tower, prefill (or "
                 "its chunks), each decode step, preempted; a tick where it finished. Hover a bar for its steps and "
                 "the decision log's sentence. Every number comes from the engine's event log, the same numbers "
                 "/metrics reports.",
                 "按请求看时间花在哪里（真实时钟）：向你自己的引擎以每秒 R 个的速度发送 N 个图片请求（三种长度的提示词轮流），"
                 "发送两次：一次不开、一次开启你选的设置，然后比较。每一行是一个请求：排队等待、视觉塔、预填充（或它的分块）、"
                 "每个解码步、被抢占；竖线表示结束。把鼠标放在条上可看到它的步和决策日志里的那句话。所有数字都来自引擎的"
                 "事件日志，与 /metrics 报告的相同。"),
    "tl.requests": ("Requests N ({low}–{high})", "请求数 N（{low}–{high}）"),
    "tl.rate": ("Arrivals per second R ({low}–{high})", "每秒到达数 R（{low}–{high}）"),
    "tl.seconds": ("At most T seconds per run ({low}–{high})", "每次运行最多 T 秒（{low}–{high}）"),
    "tl.setting": ("The one setting that differs", "唯一不同的设置"),
    "tl.set.chunked": ("chunked prefill (off → on, 64 tokens a step)", "分块预填充（关 → 开，每步 64 个 token）"),
    "tl.set.async_vision": ("async vision (off → on)", "异步视觉编码（关 → 开）"),
    "tl.set.small_pool": ("KV pool (96 → 28 blocks)", "KV 池（96 → 28 个块）"),
    "tl.set.speculation": ("speculative decoding, n-gram (off → on)", "推测解码，n-gram（关 → 开）"),
    "tl.run": ("Run both", "运行两次"),
    "tl.label_off": ("A: {setting} off", "A：{setting} 关"),
    "tl.label_on": ("B: {setting} on", "B：{setting} 开"),
    "tl.short.chunked": ("chunked prefill", "分块预填充"),
    "tl.short.async_vision": ("async vision", "异步视觉"),
    "tl.short.small_pool": ("small pool", "小 KV 池"),
    "tl.short.speculation": ("speculation", "推测解码"),
    "tl.gantt_a": ("Run A", "运行 A"),
    "tl.gantt_b": ("Run B", "运行 B"),
    "tl.table": ("Percentiles, A and B side by side", "百分位数，A 与 B 并排"),
    "tl.hist": ("Step times", "步耗时"),
    "tl.bad_input": ("refused: {what} must be between {low} and {high} (got {got})",
                     "已拒绝：{what} 必须在 {low} 到 {high} 之间（收到 {got}）"),
    "tl.what.requests": ("N (requests)", "N（请求数）"),
    "tl.what.rate": ("R (arrivals per second)", "R（每秒到达数）"),
    "tl.what.seconds": ("T (seconds)", "T（秒）"),
    "tl.busy": ("another load run is in progress on this server; try again when it ends",
                "服务器上另一个负载运行正在进行，请等它结束后再试"),
    "tl.summary": ("**{a}**: {na} requests sent, {aa} cut off at T, {sa} s · **{b}**: {nb} sent, {ab} cut off, "
                   "{sb} s · each on its own engine ({blocks}-block pool, {tokens} tokens per answer)",
                   "**{a}**：发送 {na} 个请求，{aa} 个在 T 到时被中止，用时 {sa} 秒 · **{b}**：发送 {nb} 个，{ab} 个被中止，"
                   "用时 {sb} 秒 · 各自在独立的引擎上（{blocks} 个块的 KV 池，每个回答 {tokens} 个 token）"),
    "tl.title": ("{label}: {n} requests, {steps} steps", "{label}：{n} 个请求，{steps} 步"),
    "tl.axis": ("ms since the first arrival", "自第一个请求到达起的毫秒数"),
    "tl.kind.queue": ("queue", "排队"),
    "tl.kind.vision": ("vision tower", "视觉塔"),
    "tl.kind.prefill": ("prefill", "预填充"),
    "tl.kind.chunk": ("prefill chunk", "预填充分块"),
    "tl.kind.decode": ("decode step", "解码步"),
    "tl.kind.preempted": ("preempted", "被抢占"),
    "tl.finished": ("finished", "结束"),
    "tl.step": ("step {step}", "第 {step} 步"),
    "tl.steps": ("steps {first}–{last}", "第 {first}–{last} 步"),
    "tl.no_step": ("within one step", "同一步内"),
    "tl.hover": ("{rid} · {kind} · {where} · {start}–{end} ms ({ms} ms)", "{rid} · {kind} · {where} · {start}–{end} 毫秒（{ms} 毫秒）"),
    "tl.accepted": (" · {n} guessed token(s) accepted", " · 接受了 {n} 个猜测的 token"),
    "tl.tower": (" · the tower ran {ms} ms ({n} slices)", " · 视觉塔运行了 {ms} 毫秒（{n} 个时间片）"),
    "tl.finish_hover": ("{rid} finished ({reason}) in step {step} at {ms} ms, {n} tokens",
                        "{rid} 在第 {step} 步结束（{reason}），时间 {ms} 毫秒，共 {n} 个 token"),
    "tl.hist_title": ("Step times: start to end of each scheduler step", "步耗时：每个调度步从开始到结束"),
    "tl.hist_axis": ("ms per step", "每步毫秒数"),
    "tl.hist_count": ("steps", "步数"),
    "tl.hist_hover": ("%{x} ms: %{y} steps", "%{x} 毫秒：%{y} 步"),
    "tl.m.figure": ("figure", "指标"),
    "tl.mean": ("mean", "均值"),
    "tl.m.ttft": ("TTFT {q}", "首 token 延迟 {q}"),
    "tl.m.itl": ("inter-token latency {q}", "token 间延迟 {q}"),
    "tl.m.e2e": ("end-to-end {q}", "端到端 {q}"),
    "tl.m.queue": ("queue time {q}", "排队时间 {q}"),
    "tl.m.step": ("step time {q}", "步耗时 {q}"),
    "tl.m.tokens_per_s": ("tokens/s (all requests)", "每秒 token 数（全部请求）"),
    "tl.m.finished": ("finished / sent", "完成 / 发送"),
    "tl.empty": ("Run both to see the two timelines.", "点击“运行两次”查看两条时间线。"),
}
