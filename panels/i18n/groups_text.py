"""Messages about a hybrid model's KV-cache groups (Qwen3.5's recurrent state slots, Gemma 3's sliding window): the
status line's part, the KV tab's group views and its decision log's grouped sentences. id -> (English, 简体中文)."""

MESSAGES = {
    # the header's status line (panels/holder.py): what each group holds
    "header.groups": (" · KV-cache groups: {groups}", "· KV 缓存组：{groups}"),
    "header.group_full": ("full attention (layer{s} {layers}): {size} blocks ({mib} MiB)",
                          "全注意力（第 {layers} 层）：{size} 块（{mib} MiB）"),
    "header.group_sliding": ("sliding window (layer{s} {layers}, window {window}): {size} blocks ({mib} MiB)",
                             "滑动窗口（第 {layers} 层，窗口 {window}）：{size} 块（{mib} MiB）"),
    "header.group_shared": ("KV-shared (layer{s} {layers}, each reads: {reads}): 0 blocks (0 MiB)",
                            "共享 KV（第 {layers} 层，各自读取：{reads}）：0 块（0 MiB）"),
    "header.group_recurrent": ("recurrent state (layer{s} {layers}): {size} slots = {running} running + {checkpoints} "
                               "checkpoints ({mib} MiB)",
                               "循环状态（第 {layers} 层）：{size} 个槽位 = {running} 个运行中 + {checkpoints} 个检查点"
                               "（{mib} MiB）"),
    # the KV tab's group views (panels/group_views.py)
    "groups.label": ("KV-cache groups (hybrid model): each kind of layer keeps its own pool and its own table per "
                     "request", "KV 缓存组（混合模型）：每种层有自己的池，每个请求在其中有自己的表"),
    "groups.heading": ("<b>KV-cache groups at step {step}</b> ({shows})",
                       "<b>第 {step} 步的 KV 缓存组</b>（{shows}）"),
    "groups.replayed": ("replayed from the event log, as the map", "与块图一样由事件日志回放"),
    "groups.full": ("<b>Full attention</b> · layer{s} {layers} · {size} blocks of {bs} tokens, {used} in use: the "
                    "block map above (a request keeps every token's K/V while it runs)",
                    "<b>全注意力</b> · 第 {layers} 层 · {size} 个 {bs} token 的块，在用 {used} 个：即上方的块图（请求运行时"
                    "保留每个 token 的 K/V）"),
    "groups.sliding": ("<b>Sliding window</b> · layer{s} {layers} · window {window} tokens · {size} blocks: {held} "
                       "held, {free} free", "<b>滑动窗口</b> · 第 {layers} 层 · 窗口 {window} 个 token · {size} 个块：占用 "
                       "{held} 个，空闲 {free} 个"),
    "groups.sliding_why": ("A query of these layers sees the last {window} tokens, itself included. Once every later "
                           "token of a request is past a block, the block leaves its table (✕) and goes back to this "
                           "group's pool, still cached under its key until reused. Each row: a request's table, "
                           "logical block → block of this group's own pool.",
                           "这些层的查询只看最近的 {window} 个 token（含自身）。一旦请求之后的 token 都越过了某个块，"
                           "该块就离开它的表（✕），回到本组的池中，仍以其键缓存，直到被重新使用。每一行是一个请求的表："
                           "逻辑块 → 本组自己池中的块。"),
    "groups.shared": ("<b>KV-shared</b> · layer{s} {layers} · no blocks of its own: each layer attends over the K/V an "
                      "earlier layer of its type wrote, in that layer's blocks (layer → source: {reads})",
                      "<b>共享 KV</b> · 第 {layers} 层 · 没有自己的块：每层读取同类型前一层写入的 K/V，就在那一层的块里"
                      "（层 → 来源：{reads}）"),
    "groups.no_tables": ("no request holds blocks of this group now", "现在没有请求占用本组的块"),
    "groups.cell_block": ("logical block {i} (tokens {first}–{last}) → sliding block {b}",
                          "逻辑块 {i}（token {first}–{last}）→ 滑动块 {b}"),
    "groups.cell_left": ("logical block {i} (tokens {first}–{last}) left the window: given back",
                         "逻辑块 {i}（token {first}–{last}）已离开窗口：已归还"),
    "groups.left_legend": ("✕ = left the window (given back, still cached by key)", "✕ = 已离开窗口（已归还，仍按键缓存）"),
    "groups.recurrent": ("<b>Recurrent state</b> · layer{s} {layers} · {size} slots: {running} running, {checkpoints} "
                         "checkpoints, {free} free",
                         "<b>循环状态</b> · 第 {layers} 层 · {size} 个槽位：运行中 {running} 个，检查点 {checkpoints} 个，"
                         "空闲 {free} 个"),
    "groups.recurrent_why": ("These layers keep one fixed-size state per request instead of K/V per token: a running "
                             "request holds one slot, updated every step. A prefix hit needs the state at exactly the "
                             "hit's last token, so the state is saved (a checkpoint) into a free slot at the prompt's "
                             "last block boundary and at the latest block boundary while decoding, keyed like the "
                             "block there; the least recently used checkpoint is evicted first.",
                             "这些层为每个请求保存一个固定大小的状态，而不是每个 token 的 K/V：运行中的请求占一个槽位，"
                             "每步更新。前缀命中需要恰好在命中末尾 token 处的状态，所以状态会在提示词最后一个块边界、以及"
                             "解码时最新的块边界处保存（检查点）到一个空闲槽位，键与该处的块相同；最久未用的检查点先被驱逐。"),
    "groups.slot_running": ("slot {slot}: {rid}'s running state", "槽位 {slot}：{rid} 的运行状态"),
    "groups.slot_checkpoint": ("slot {slot}: checkpoint, {saved}", "槽位 {slot}：检查点，{saved}"),
    "groups.slot_free": ("slot {slot}: free", "槽位 {slot}：空闲"),
    "groups.free_word": ("free", "空闲"),
    "groups.tokens_short": ("{n} tok", "{n} 个 token"),
    "groups.saved": ("the state after {tokens} tokens (end of logical block {block}, key {key}…)",
                     "{tokens} 个 token 之后的状态（逻辑块 {block} 的末尾，键 {key}…）"),
    "groups.saved_by": (", saved by {rid}", "，由 {rid} 保存"),
    "groups.saved_earlier": (", saved before this run", "，在本次运行之前保存"),
    "groups.saved_before": ("key {key}…, saved before this run", "键 {key}…，在本次运行之前保存"),
    "groups.holds": ("{rid} holds slot {slot}", "{rid} 占用槽位 {slot}"),
    "groups.resumed": ("{rid} holds slot {slot}, resumed from the checkpoint in slot {source}: its prefix was not "
                       "computed again", "{rid} 占用槽位 {slot}，从槽位 {source} 的检查点恢复：它的前缀没有重新计算"),
    "groups.checkpoints_head": ("Checkpoints (a later request with this prefix resumes there):",
                                "检查点（之后前缀相同的请求从这里继续）："),
    "groups.no_checkpoints": ("no checkpoint saved", "没有保存的检查点"),
    # the decision log and run counters (panels/decisions.py)
    "groups.stored_run": ("{rid} filled sliding-window blocks {blocks} → each stored under its key ({keys})",
                          "{rid} 填满了滑动窗口块 {blocks} → 各自以其键存入缓存（{keys}）"),
    "groups.run_line": ("**KV-cache groups this run**: {parts}", "**本次运行的 KV 缓存组**：{parts}"),
    "groups.run_sliding": ("{n} sliding-window block{s} left the window", "{n} 个滑动窗口块离开了窗口"),
    "groups.run_recurrent": ("{saved} recurrent state{s} checkpointed ({evicted} evicted)",
                             "{saved} 个循环状态存为检查点（驱逐 {evicted} 个）"),
}
