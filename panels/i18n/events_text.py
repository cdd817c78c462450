"""The engine's event sentences and step plans (minivlm.views.events.describe / describe_plan), message by message:
the English is the engine's own wording (tests/test_i18n.py checks that rendering these from a run's event fields
gives exactly its sentences), the Chinese is the same data said in Chinese. id -> (English, 简体中文)."""

MESSAGES = {
    "ev.arrived": ("{rid} arrived: {tokens} prompt tokens, {images} image(s)",
                   "{rid} 到达：提示词 {tokens} 个 token，{images} 张图片"),
    "ev.scheduled": ("{kind} {n} request(s), {tokens} token(s)", "{kind} {n} 个请求，{tokens} 个 token"),
    "ev.mixed_chunks": ("{head}: prefill chunk(s) {chunks}; the rest decode", "{head}：预填充分块 {chunks}；其余在解码"),
    "ev.no_prefix": ("{rid} found no cached prefix", "{rid} 没有找到已缓存的前缀"),
    "ev.reused": ("{rid} reused {n} cached block(s) ({tokens} tokens){false}",
                  "{rid} 复用了 {n} 个已缓存的块（{tokens} 个 token）{false}"),
    "ev.false_hits": (", FALSE hits on {blocks}", "，其中{blocks}是误命中"),
    "ev.got": ("{rid} got {sw}{blocks}", "{rid} 分到了{sw}{blocks}"),
    "ev.sw": ("sliding-window ", "滑动窗口"),
    "ev.left_window": ("{rid} gave back {sw}{blocks}: no later token of it can see them (its {window}-token window "
                       "moved on); {where}",
                       "{rid} 归还了{sw}{blocks}：它之后的 token 都看不到它们了（{window} 个 token 的窗口已经移过）；{where}"),
    "ev.window_kept": ("they stay cached until reused", "内容保留在缓存中，直到被重新使用"),
    "ev.window_not_kept": ("not cached", "内容没有缓存"),
    "ev.window_some_kept": ("{kept} stay cached until reused, the rest not", "{kept}的内容保留在缓存中，直到被重新使用，其余没有缓存"),
    "ev.state_saved": ("{rid}'s recurrent state after {tokens} tokens saved in slot {slot} (checkpoint under key "
                       "{key}…): a later request with this prefix resumes there",
                       "{rid} 在 {tokens} 个 token 之后的循环状态存入槽位 {slot}（检查点，键 {key}…）：之后前缀相同的请求从这里继续"),
    "ev.speculated": ("{rid} proposed {n} token(s) found at {where}; accepted {accepted}{back}",
                      "{rid} 提议了 {n} 个 token（在{where}找到）；接受了 {accepted} 个{back}"),
    "ev.spec_prompt": ("token {at} (in the prompt)", "第 {at} 个 token（提示词中）"),
    "ev.spec_answer": ("token {at} (in its answer)", "第 {at} 个 token（它的回答中）"),
    "ev.spec_back": ("; slot{s} {slots} given back", "；槽位 {slots} 归还"),
    "ev.not_speculated": ("{rid} does not speculate: the model's {kind} KV-cache group cannot hold guessed tokens "
                          "and give them back", "{rid} 不做推测解码：模型的 {kind} KV 缓存组不能暂存猜测的 token 再归还"),
    "ev.constrained": ("{rid}'s grammar allowed {allowed} of {vocab} tokens; it chose {text} (token {token})",
                       "{rid} 的语法允许 {vocab} 个 token 中的 {allowed} 个；它选了 {text}（token {token}）"),
    "ev.state_evicted": ("state checkpoint in slot {slot} evicted: key {key}… forgotten",
                         "槽位 {slot} 中的状态检查点被驱逐：键 {key}… 被遗忘"),
    "ev.no_new_block": ("{rid} needed no new block", "{rid} 不需要新块"),
    "ev.stored": ("{rid} filled {sw}block {block} ({n}/{n}) → stored under key {key}…",
                  "{rid} 填满了{sw}块 {block}（{n}/{n}）→ 以键 {key}… 存入缓存"),
    "ev.stored_run": ("{rid} filled blocks {blocks} → each stored under its key ({keys})",
                      "{rid} 填满了块 {blocks} → 各自以其键存入缓存（{keys}）"),
    "ev.freed": ("{rid} released {sw}{blocks} (content stays cached until reused)",
                 "{rid} 释放了{sw}{blocks}（内容保留在缓存中，直到被重新使用）"),
    "ev.freed_uncached": ("{rid} released {sw}{blocks} (content not cached)", "{rid} 释放了{sw}{blocks}（内容没有缓存）"),
    "ev.freed_some": ("{rid} released {sw}{blocks} ({kept}: content stays cached until reused; {rest}: not cached)",
                      "{rid} 释放了{sw}{blocks}（{kept}：内容保留在缓存中，直到被重新使用；{rest}：没有缓存）"),
    "ev.freed_guesses": ("{rid} gave back {sw}{blocks}, which held only guesses it did not keep (never cached)",
                         "{rid} 归还了{sw}{blocks}：其中只有它没有保留的猜测 token（从未缓存）"),
    "ev.evicted": ("{sw}{blocks} evicted: key {key}… forgotten", "{sw}{blocks} 被驱逐：键 {key}… 被遗忘"),
    "ev.cleared": ("prefix cache reset: every free block's key forgotten", "前缀缓存已重置：所有空闲块的键都被遗忘"),
    "ev.preempted": ("{rid} preempted: {reason}", "{rid} 被抢占：{reason}"),
    "ev.preempt_newest": ("{needer} needs a block for its next token; none is free; preempting the newest running "
                          "request, {victim}, releasing its {n} blocks ({free} become free); its {tokens} tokens will "
                          "be recomputed",
                          "{needer} 的下一个 token 需要一个块；没有空闲块；抢占最新的运行中请求 {victim}，释放它的 {n} 个"
                          "块（{free} 个变为空闲）；它的 {tokens} 个 token 之后会重新计算"),
    "ev.preempt_itself": ("{needer} needs a block for its next token; none is free; no other request is running, so "
                          "{victim} itself, releasing its {n} blocks ({free} become free); its {tokens} tokens will be "
                          "recomputed",
                          "{needer} 的下一个 token 需要一个块；没有空闲块；没有其他运行中的请求，所以抢占 {victim} 自己，"
                          "释放它的 {n} 个块（{free} 个变为空闲）；它的 {tokens} 个 token 之后会重新计算"),
    "ev.encoded": ("{rid}'s {n} image(s) encoded on the vision thread in {secs} s ({waited}); its image tokens are "
                   "computed now",
                   "{rid} 的 {n} 张图片在视觉线程上编码完成，用时 {secs} 秒（{waited}）；现在计算它的图像 token"),
    "ev.waited": ("steps {first}-{last} ran without it", "第 {first}-{last} 步在没有它的情况下运行"),
    "ev.ready": ("ready in the step it arrived", "在到达的那一步就已就绪"),
    "ev.sliced": ("; the tower ran in {n} slices lent between steps", "；视觉塔分 {n} 个时间片在步与步之间运行"),
    "ev.failed": ("{rid} failed during {stage}: {error}", "{rid} 在 {stage} 阶段失败：{error}"),
    "ev.finished": ("{rid} finished ({reason})", "{rid} 完成（{reason}）"),
    "ev.block": ("block {ids}", "块 {ids}"),
    "ev.blocks": ("blocks {ids}", "块 {ids}"),
    "step.prefill": ("prefill", "预填充"), "step.decode": ("decode", "解码"), "step.mixed": ("mixed", "混合"),
    "reason.stop": ("stop", "停止符"), "reason.length": ("length", "达到长度上限"), "reason.abort": ("abort", "中止"),
    "reason.error": ("error", "出错"),
    # a step's plan (minivlm.views.events.describe_request)
    "plan.decode": ("{rid} decode 1 token {where}{new}", "{rid} 解码 1 个 token {where}{new}"),
    "plan.at_slot": ("at slot {slot}", "写入槽位 {slot}"),
    "plan.new_block": (" (new block {ids})", "（新块 {ids}）"),
    "plan.draft": (" + {n} guessed token(s) in slots {slots}", " + {n} 个猜测的 token，写入槽位 {slots}"),
    "plan.prefill": ("{rid} prefill tokens {first}–{last}{into}{tail}", "{rid} 预填充 token {first}–{last}{into}{tail}"),
    "plan.chunk": ("{rid} prefill chunk tokens {first}–{last}{into}{tail}",
                   "{rid} 分块预填充 token {first}–{last}{into}{tail}"),
    "plan.into": (" into blocks {parts}", "，写入块 {parts}"),
    "plan.hits": ("{ids} (hits)", "{ids}（命中）"),
    "plan.new": ("{ids} (new)", "{ids}（新分配）"),
    "plan.encodes": ("; encodes its images", "；编码它的图片"),
    "plan.samples": ("; samples a token", "；采样一个 token"),
    "plan.nothing": ("nothing ran", "什么也没运行"),
    "plan.sep": ("; ", "；"),
}
