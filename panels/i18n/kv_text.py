"""Messages of the KV tab: its controls, summary lines, the decision log (the engine's events said from their
fields: ids and numbers), the block map, timeline and prefix tree. id -> (English, 简体中文). The English decision
log is the engine's own (minivlm.views.events); the "ev.*" and "plan.*" texts are its Chinese."""

MESSAGES = {
    "kv.live": ("Live (poll the engine once a second; your own run updates anyway)",
                "实时（每秒查询一次引擎；你自己的运行无论如何都会更新）"),
    "kv.refresh": ("Refresh now", "立即刷新"),
    "kv.back": ("Back to live", "回到实时"),
    "kv.pause": ("Pause", "暂停"),
    "kv.step": ("Step", "单步"),
    "kv.step10": ("Step ×10", "单步 ×10"),
    "kv.resume": ("Run (resume)", "运行（恢复）"),
    "kv.shared_note": ("Shared deployment: your launches and your step-through run on a {blocks}-block engine of your "
                       "own (the weights are shared, the other visitors' requests and cache are not); your chats go "
                       "to the shared engine, which is never paused.",
                       "共享部署：你发起的请求和单步演示运行在你自己的 {blocks} 块引擎上（权重共享，其他访客的请求和缓存"
                       "不共享）；你的对话发往共享引擎，它从不暂停。"),
    "kv.summary": ("summary", "摘要"),
    "kv.map": ("Physical KV blocks", "物理 KV 块"),
    "kv.log_heading": ("**Decision log** (newest step first; the engine's own words)",
                       "**决策日志**（最新的一步在最上面；引擎自己的话）"),
    "kv.log": ("decision log", "决策日志"),
    "kv.n": ("concurrent requests", "并发请求数"),
    "kv.tokens": ("max tokens each", "每个请求的最大 token 数"),
    "kv.no_eos": ("ignore EOS (every request decodes to max tokens)", "忽略 EOS（每个请求都解码到最大 token 数）"),
    "kv.launch": ("Launch N requests", "发起 N 个请求"),
    "kv.slider": ("replay step (after a launch or a pause)", "回放步（发起请求或暂停之后）"),
    "kv.slider_run": ("replay step ({n} steps recorded in this run: {first}–{last}; {first} is before the first "
                      "arrival)", "回放步（本次运行记录了 {n} 步：{first}–{last}；{first} 在第一个请求到达之前）"),
    "kv.timeline": ("Timeline of this run: requests × steps", "本次运行的时间线：请求 × 步"),
    "kv.table": ("Block tables: logical index → physical block", "块表：逻辑序号 → 物理块"),
    "kv.download": ("Download events (JSONL)", "下载事件（JSONL）"),
    "kv.events_file": ("events of this run", "本次运行的事件"),
    "kv.tree": ("Prefix cache as a tree (the engine the block map shows, now)", "前缀缓存树（块图所示引擎的当前状态）"),
    "kv.ended_by_rebuild": ("⚠ Your {what} ended: the engine was rebuilt (a header setting changed), which aborted "
                            "its unfinished requests and emptied the prefix cache. The views now show the new engine; "
                            "launch again to record a new run.",
                            "⚠ 你的{what}已结束：引擎被重建了（设置栏改了某项设置），未完成的请求被中止，前缀缓存被清空。"
                            "现在显示的是新引擎；请重新发起请求以记录新的运行。"),
    "kv.what_launch": ("launch", "发起的请求"),
    "kv.what_run": ("run", "运行"),
    "kv.launch_ended": ("Your launch ended: the engine was rebuilt.", "你发起的请求已结束：引擎被重建了。"),
    "kv.paused_elsewhere": ("**⏸ The engine is paused by step-through** (in this or another page): every request, "
                            "chats included, waits. Press Step to run one step, or Run (resume) to let it go.",
                            "**⏸ 引擎因单步演示而暂停**（在本页或其他页面）：所有请求（包括对话）都在等待。按“单步”运行一步，"
                            "或按“运行（恢复）”让它继续。"),
    "kv.shared_title": ("The shared engine: totals only (your own engine's blocks appear after Launch or Pause)",
                        "共享引擎：只显示总数（发起请求或暂停后，这里显示你自己引擎的块）"),
    "kv.shared_totals": ("**Shared engine, totals only**: {running} running · {waiting} waiting · {used} of {total} "
                         "blocks in use, {cached} cached. Its blocks, keys and requests belong to the other visitors; "
                         "press **Launch N requests** or **Pause** to get an engine of your own ({blocks} blocks, the "
                         "same weights) whose every block this tab then shows.",
                         "**共享引擎，只显示总数**：运行中 {running} · 等待中 {waiting} · {total} 个块中 {used} 个在用，"
                         "{cached} 个已缓存。它的块、键和请求属于其他访客；按 **发起 N 个请求** 或 **暂停**，即可得到你自己的"
                         "引擎（{blocks} 块，同样的权重），本页签会显示它的每一个块。"),
    "kv.live_word": ("live", "实时"),
    "kv.replay_word": ("**replay** (live is at step {step}; press Back to live)",
                       "**回放**（实时已到第 {step} 步；按“回到实时”返回）"),
    "kv.no_replay": ("live (no replay: {why})", "实时（无法回放：{why}）"),
    "kv.paused_suffix": (" · **engine paused: press Step or Run**", " · **引擎已暂停：请按“单步”或“运行”**"),
    "kv.bad_launch": ("The launcher runs 1 to {most} requests of 4 to {tokens} tokens each here; got {got}.",
                      "这里一次可发起 1 到 {most} 个请求，每个 4 到 {tokens} 个 token；收到的是 {got}。"),
    "kv.queued": ("{n} requests queued: they arrive at the next Step.", "{n} 个请求已排队：它们会在下一次单步时到达。"),
    "kv.pause_first": ("Press Pause first: Step runs one scheduler iteration of a paused engine.",
                       "请先按“暂停”：单步是让暂停的引擎执行一次调度迭代。"),
    "kv.nothing_left": ("Nothing left to run: launch requests or send a chat, then Step.",
                        "没有可运行的了：先发起请求或发送对话，再按“单步”。"),
    "kv.replay_first": ("Launch or Pause first: replay shows the steps of your current run.",
                        "请先发起请求或暂停：回放显示的是你当前运行的各步。"),
    "kv.download_first": ("Launch or Pause first: the download holds the events of your current run.",
                          "请先发起请求或暂停：下载的是你当前运行的事件。"),
    # summary lines (panels/decisions.py)
    "kv.no_decisions": ("_No decisions yet: launch requests (or send a chat), then Step or Run._",
                        "_还没有决策：先发起请求（或发送对话），再按“单步”或“运行”。_"),
    "kv.step_head": ("- **step {step}** · {ran}", "- **第 {step} 步** · {ran}"),
    "kv.nothing_ran": ("nothing ran", "什么也没运行"),
    "kv.plan_line": ("    - plan: {plan}", "    - 计划：{plan}"),
    "kv.budget_line": ("    - budget: up to {tokens} prompt tokens beside the decodes ({why})",
                       "    - 预算：除解码外最多 {tokens} 个提示 token（{why}）"),
    "kv.budget_unmeasured": ("nothing measured yet: a few tokens to start", "尚未测量：先取少量 token"),
    "kv.budget_no_stream": ("no stream running: the whole ceiling", "没有正在解码的流：取整个上限"),
    "kv.budget_why": ("a decode step {decode} ms, a mixed step's extra {fixed} ms + {token} ms a prompt token; "
                      "mixed steps at most {slowdown}x a decode step",
                      "解码步 {decode} ms，混合步额外 {fixed} ms + 每个提示 token {token} ms；混合步至多为解码步的 "
                      "{slowdown} 倍"),
    "kv.older": ("- _… {n} earlier step(s): download the events for all of them_",
                 "- _… 还有更早的 {n} 步：下载事件可看到全部_"),
    "kv.run_line": ("**This run** (from its first arrival): {arrived} requests arrived, {finished} finished · {steps} "
                    "steps ({prefill} prefill, {decode} decode{mixed}) · **{preempted} preemptions** · {reused} "
                    "blocks reused from the prefix cache ({false} false) · {stored} stored, {evicted} evicted",
                    "**本次运行**（从第一个请求到达起）：到达 {arrived} 个请求，完成 {finished} 个 · {steps} 步（预填充 "
                    "{prefill}，解码 {decode}{mixed}）· **抢占 {preempted} 次** · 从前缀缓存复用 {reused} 个块（其中误命中 "
                    "{false} 个）· 存入 {stored} 个，驱逐 {evicted} 个"),
    "kv.run_mixed": (", {n} mixed", "，混合 {n}"),
    "kv.frame_line": ("**step {step}** · {shows} · running {running} · waiting {waiting} · blocks used {used} / cached "
                      "{cached} / free {free} of {total}",
                      "**第 {step} 步** · {shows} · 运行中 {running} · 等待中 {waiting} · 块：在用 {used} / 已缓存 "
                      "{cached} / 空闲 {free}，共 {total}"),
    "kv.lifetime_line": ("Engine lifetime (all runs and chats since it started): step {step} · preemptions {preempted} "
                         "· prefix-cache hits {hits} (true {true}, false {false}) in {lookups} lookups",
                         "引擎生命周期（启动以来的所有运行和对话）：第 {step} 步 · 抢占 {preempted} 次 · 前缀缓存命中 "
                         "{hits} 次（真命中 {true}，误命中 {false}），共查找 {lookups} 次"),
    "kv.encoder_line": ("Encoder cache (vision-tower outputs, since the engine started): {hits} hits, {misses} misses · "
                        "{used} of {size} embeddings held ({in_use} in use by running requests)",
                        "编码器缓存（视觉塔输出，引擎启动以来）：命中 {hits} 次，未命中 {misses} 次 · 持有 {used} / {size} "
                        "个嵌入（其中 {in_use} 个正被运行中的请求使用）"),
    "kv.paging_none": ("**Paged vs contiguous**: no request holds KV right now.",
                       "**分页 vs 连续**：目前没有请求持有 KV。"),
    "kv.paging": ("**Paged vs contiguous**: a contiguous engine would reserve {requests} × {max_len} = "
                  "**{slots}** token slots for these {requests} requests; the paged pool holds {blocks} blocks × "
                  "{block_size} = **{paged}** ({share} of that) for {tokens} tokens · internal fragmentation: "
                  "**{unused}** unused slots in partly filled blocks ({waste} of what is held){shared}",
                  "**分页 vs 连续**：连续分配的引擎会为这 {requests} 个请求预留 {requests} × {max_len} = **{slots}** "
                  "个 token 槽位；分页池只占 {blocks} 块 × {block_size} = **{paged}**（为前者的 {share}），存放 "
                  "{tokens} 个 token · 内部碎片：未填满的块里有 **{unused}** 个空槽位（占已持有的 {waste}）{shared}"),
    "kv.paging_shared": (" · prefix sharing saves {n} more block{s}", " · 前缀共享又省下 {n} 个块"),
    # block map, table (panels/plots.py)
    "map.title": ("KV pool at step {step}: {blocks} blocks × {block_size} tokens",
                  "第 {step} 步的 KV 池：{blocks} 块 × {block_size} 个 token"),
    "map.free_hover": ("block {id} · {state}<br>{n} tokens{tail}", "块 {id} · {state}<br>{n} 个 token{tail}"),
    "map.cached_state": ("cached (free, revivable by hash)", "已缓存（空闲，可按哈希复活）"),
    "map.free_state": ("free", "空闲"),
    "map.hash_tail": ("<br>hash {hash}", "<br>哈希 {hash}"),
    "map.used_hover": ("block {id} · ref {ref} · {kind}<br>{n} tokens filled<br>hash {hash}<br>owners {owners}",
                       "块 {id} · 引用 {ref} · {kind}<br>已填 {n} 个 token<br>哈希 {hash}<br>持有者 {owners}"),
    "map.not_full": ("— (not full yet)", "—（尚未填满）"),
    "map.image_tokens": ("image tokens", "图像 token"),
    "map.mixed_tokens": ("mixed tokens", "图文混合 token"),
    "map.video_tokens": ("video tokens", "视频 token"),
    "map.drafts": ("guessed tokens this step", "本步猜测的 token"),
    "map.draft_kept": ("slot {slot}: {rid}'s guess, accepted", "槽位 {slot}：{rid} 的猜测，已接受"),
    "map.draft_freed": ("slot {slot}: {rid}'s guess, rejected: block {block} given back (it held only rejected "
                        "guesses)", "槽位 {slot}：{rid} 的猜测，被拒绝：块 {block} 已归还（其中只有被拒绝的猜测）"),
    "map.draft_overwritten": ("slot {slot}: {rid}'s guess, rejected: left in block {block}, which {rid} keeps; its "
                              "next tokens overwrite it", "槽位 {slot}：{rid} 的猜测，被拒绝：留在 {rid} 保留的块 {block} "
                              "中，它之后的 token 会覆盖它"),
    "map.ref_count": ("ref count (shared)", "引用计数（共享）"),
    "map.cached_legend": ("cached (free)", "已缓存（空闲）"),
    "map.free_legend": ("free", "空闲"),
    "table.request": ("request", "请求"), "table.logical": ("logical", "逻辑序号"), "table.physical": ("physical", "物理块"),
    "table.fill": ("fill", "填充"), "table.kind": ("kind", "类型"), "table.ref_count": ("ref_count", "引用计数"),
    "table.hash": ("hash", "哈希"),
    # timeline (panels/timeline.py)
    "state.waiting": ("waiting", "等待"), "state.prefill": ("prefill", "预填充"), "state.decode": ("decode", "解码"),
    "state.idle": ("idle", "空闲等待"), "state.preempted": ("preempted", "被抢占"), "state.finished": ("finished", "完成"),
    "timeline.cell": ("{rid} · step {step}: {state}", "{rid} · 第 {step} 步：{state}"),
    "timeline.preempted_hover": ("%{y} · step %{x}: preempted", "%{y} · 第 %{x} 步：被抢占"),
    "timeline.hit": ("cache hit", "缓存命中"),
    "timeline.false_hit": ("false cache hit", "缓存误命中"),
    "timeline.hit_hover": ("{rid} reused {n} cached block(s) at step {step}", "{rid} 在第 {step} 步复用了 {n} 个已缓存的块"),
    "timeline.false_suffix": (", {n} FALSE", "，其中 {n} 个是误命中"),
    "timeline.title": ("{n} request(s) × steps {first}–{last}", "{n} 个请求 × 第 {first}–{last} 步"),
    "timeline.showing": (" · showing step {step}", " · 显示第 {step} 步"),
    "timeline.axis": ("scheduler step", "调度步"),
    # prefix tree (panels/prefix_tree.py)
    "tree.in_use": ("in use by {n} request{s}", "被 {n} 个请求使用"),
    "tree.cached": ("cached, free: overwritten after {n} more block allocation{s} (eviction rank {rank})",
                    "已缓存、空闲：再分配 {n} 个块后会被覆盖（驱逐顺位 {rank}）"),
    "tree.root": ("root (a prompt's first block)", "根（提示词的第一个块）"),
    "tree.parent_block": ("block {id}", "块 {id}"),
    "tree.orphan": ("evicted: no lookup reaches this block", "已驱逐：任何查找都到不了这个块"),
    "tree.hover": ("block {id} · {kind} · {n} tokens<br>key {key}…<br>parent: {parent}<br>{state}",
                   "块 {id} · {kind} · {n} 个 token<br>键 {key}…<br>父块：{parent}<br>{state}"),
    "tree.kind_block": ("{kind} block", "{kind} 块"),
    "tree.next_evicted": ("next to be evicted", "下一个被驱逐的"),
    "tree.title": ("Prefix cache as a tree: {n} blocks a lookup finds ({in_use} in use, {free} cached and free), {roots} "
                   "root{s_roots}, {branches} branch point{s_branches}{orphans}"
                   "<br><sup>a lookup walks right from a root while the keys match · faded: free but cached (revivable) "
                   "· ×n: shared by n requests · red ring: the next block the free queue overwrites</sup>",
                   "前缀缓存树：查找能找到的 {n} 个块（{in_use} 个在用，{free} 个已缓存且空闲），{roots} 个根，"
                   "{branches} 个分叉点{orphans}"
                   "<br><sup>查找从根出发向右走，直到键不再匹配 · 淡色：空闲但仍缓存（可复活）· ×n：被 n 个请求共享 · "
                   "红框：空闲队列下一个要覆盖的块</sup>"),
    "tree.orphans": (", {n} orphaned (parent evicted)", "，{n} 个孤块（父块已驱逐）"),
    "tree.axis": ("position in the chain (logical block index)", "在链中的位置（逻辑块序号）"),
    "tree.none_yet": ("Your own engine's prefix tree appears after Launch or Pause",
                      "发起请求或暂停后，这里显示你自己引擎的前缀树"),
    "kind.text": ("text", "文本"), "kind.image": ("image", "图像"), "kind.mixed": ("mixed", "图文混合"),
    "kind.video": ("video", "视频"), "kind.free": ("free", "空闲"),
}
