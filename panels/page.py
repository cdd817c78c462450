"""The page around the tabs: its CSS (dark theme for the figures' text, a phone-width layout) and the script that
runs once it loads (accessible names gradio does not give, the engine settings folded on a narrow screen)."""
import json

import gradio as gr

from panels.i18n import CATALOGUE, EN, ZH
from panels.theme import CJK_FONTS

# a device choice greyed out: its label says it is unavailable, in either language (data-testid is the label)
UNAVAILABLE = "label:is(" + ", ".join(f'[data-testid*="{CATALOGUE["header.unavailable_choice"][i].format(name="")}"]'
                                       for i in (0, 1)) + ")"
NARROW_PX = 720  # below this page width the header folds and the plots drop their modebar
# the words the page script writes itself (accessible names), in both languages, from the catalogue
SCRIPT_WORDS = {lang: {k.split(".", 1)[1]: CATALOGUE[k][i] for k in ("chat.input_aria", "chat.example_aria",
                                                                   "chat.picture_aria")}
                for i, lang in enumerate((EN, ZH))}

CSS = f"""
#lang-switch {{ flex-grow: 0; }}
#device-picker {UNAVAILABLE} {{ opacity: 0.45; pointer-events: none; }}
#engine-status {{ font-size: 0.9em; }}
/* figures have transparent backgrounds (panels/theme.py); their own words (title, every subplot's axis ticks and
   titles, subplot titles, legend) turn light in the dark theme, the words drawn on data (cells, bars, discs) keep
   the colour the figure gave them */
.dark .js-plotly-plot :is(.infolayer, .xaxislayer-above, .yaxislayer-above, .xaxislayer-below, .yaxislayer-below)
  text {{ fill: var(--body-text-color) !important; }}
@media (max-width: {NARROW_PX}px) {{
  #app-title h1 {{ font-size: 1.25em; margin: 0; }}
  #engine-status {{ font-size: 0.8em; }}
  /* what a rebuild would end is said next to the settings: folded with them, so the tabs stay on the first screen */
  #engine-settings:has(> button.label-wrap:not(.open)) ~ #rebuild-note {{ display: none; }}
  #tabs [role=tablist] button {{ padding-left: 10px; padding-right: 10px; }}
  /* on a phone the modebar would cover the figure's title; pinch-zoom does its work there */
  .js-plotly-plot .modebar-container {{ display: none !important; }}
  /* a figure's label above it, not over its title (a long label takes two lines on a phone) */
  .block:has(> .js-plotly-plot) > label[data-testid=block-label] {{ position: static; }}
}}
/* a label above what it names, never over it: the image boxes' labels under their buttons, the chat's over its
   first picture */
:is(#anat-img1, #anat-img2, #chatbot) label[data-testid=block-label] {{ position: static; margin-bottom: 4px;
  max-width: calc(100% - 96px); }}  /* room for the buttons at the right */
/* a label never runs out of its box: a slider's number box goes under a label too long to share its line, and a
   long identifier (gpu_memory_utilization) breaks inside it only where it alone is wider than the box */
span[data-testid=block-info] {{ overflow-wrap: anywhere; }}
.head:has(> label > span[data-testid=block-info]) {{ flex-wrap: wrap; row-gap: 4px; }}
.head > label:has(> span[data-testid=block-info]) {{ flex: 1 1 auto; min-width: 0; max-width: 100%; }}
/* a figure narrower than the width its words need (its layout.meta.min_width, set by the page script) scrolls
   sideways in its box: the page itself never gets wider than the screen */
.block:has(> .js-plotly-plot) {{ overflow-x: auto; }}
"""

TABLE_CHAR_PX, TABLE_CELL_PX = 8.4, 30  # a letter of a table's monospace font, and a cell's padding and menu button


def header_widths(headers: list[str], given: dict[int, str] | None = None) -> list[str]:
    """gr.Dataframe column widths that never break a header inside a word: gradio sizes an "auto" column by its
    cells alone, so a header longer than its cells broke ("strat-egy" at any width, one letter a line on a phone).
    Each column gets its header's longest word (its cells wrap to that), but those `given` ({index: width}: "auto"
    for cells longer than the header, a share like "55%" for sentences)."""
    given = given or {}
    return [given.get(i) or f"{round(TABLE_CHAR_PX * max(map(len, h.split())) + TABLE_CELL_PX)}px"
            for i, h in enumerate(headers)]


# Runs once the page has loaded. Gradio gives no accessible name to a radio group or the multimodal chat box and
# no alt text to an example's picture, and greys out nothing for the keyboard: set those, and set them again
# whenever gradio redraws a part of the page. On a narrow screen the engine settings start folded.
JS = f"""() => {{
    const said = {json.dumps(SCRIPT_WORDS, ensure_ascii=False)};
    window.__minivlm_lang = window.__minivlm_lang || (navigator.language.toLowerCase().startsWith('zh') ? '{ZH}' : '{EN}');
    const word = (key) => said[window.__minivlm_lang][key];
    const words = (src) => decodeURIComponent(src.split('/').pop().split('?')[0]).replace(/\\.[a-z]+$/i, '')
        .replace(/[_-]+/g, ' ');
    const label = () => {{
        const box = document.querySelector('#chat-input textarea');
        if (box && box.getAttribute('aria-label') !== word('input_aria'))
            box.setAttribute('aria-label', word('input_aria'));
        document.querySelectorAll('fieldset').forEach((group) => {{
            const name = group.querySelector('[data-testid="block-info"]');
            if (!group.querySelector('input[type=radio]') || !name) return;
            group.setAttribute('role', 'radiogroup');
            if (group.getAttribute('aria-label') !== name.textContent.trim())
                group.setAttribute('aria-label', name.textContent.trim());
        }});
        document.querySelectorAll('#device-picker {UNAVAILABLE} input').forEach((input) => {{
            if (!input.disabled) input.disabled = true;
            input.setAttribute('aria-disabled', 'true');
        }});
        document.querySelectorAll('button.gallery-item').forEach((item) => {{
            const pictures = [...item.querySelectorAll('img')];
            pictures.forEach((img) => {{
                const alt = word('picture_aria') + ': ' + words(img.src);
                if (img.alt !== alt) img.alt = alt;
            }});
            const text = [...item.querySelectorAll('p')].map((p) => p.textContent.trim()).filter(Boolean).join(' · ');
            const name = word('example_aria') + ': ' + [text, ...pictures.map((img) => img.alt)].filter(Boolean).join(' — ');
            if (item.getAttribute('aria-label') !== name) item.setAttribute('aria-label', name);
        }});
    }};
    // a figure says the width below which its words would collide (layout.meta.min_width, px: a token strip's
    // labelled cells, a deep prefix tree, titles): it keeps that width and its box scrolls sideways
    const widths = () => document.querySelectorAll('.js-plotly-plot').forEach((plot) => {{
        const px = plot.layout?.meta?.min_width;
        const want = px ? `${{px}}px` : '';
        if (plot.style.minWidth === want) return;
        plot.style.minWidth = want;
        window.Plotly?.Plots.resize(plot);
    }});
    label();
    widths();
    let queued = false;
    new MutationObserver(() => {{
        if (queued) return;
        queued = true;
        requestAnimationFrame(() => {{ queued = false; label(); widths(); }});
    }}).observe(document.body, {{subtree: true, childList: true, attributes: true,
                                  attributeFilter: ['disabled', 'src', 'aria-label']}});
    // a replay step typed outside the run: gradio says so and puts the box back in range, but replays nothing;
    // replay the step the box now shows, so the page never shows one step and names another
    document.addEventListener('change', (ev) => {{
        const range = document.querySelector('#kv-step input[type=range]');
        if (!range || !ev.target.matches?.('#kv-step input[type=number]')) return;
        const typed = +ev.target.value;
        if (typed >= +range.min && typed <= +range.max) return;
        setTimeout(() => {{
            const set = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
            const step = Math.min(+range.max, Math.max(+range.min, typed));
            set.call(ev.target, step);
            set.call(range, step);
            range.dispatchEvent(new Event('input', {{bubbles: true}}));
            range.dispatchEvent(new Event('change', {{bubbles: true}}));
            range.dispatchEvent(new PointerEvent('pointerup', {{bubbles: true}}));
        }}, 300);
    }}, true);
    if (window.matchMedia('(max-width: {NARROW_PX}px)').matches) {{
        const fold = document.querySelector('#engine-settings > button.label-wrap');
        if (fold && fold.classList.contains('open')) fold.click();
    }}
}}"""

# the header's language switch, in the page first: the script's own words follow it (the server sends the rest)
SWITCH_JS = """(lang) => { window.__minivlm_lang = lang; document.documentElement.lang = lang; return lang; }"""

# gradio's Soft theme with the Chinese fonts before the generic family, so no glyph falls to a font without it
THEME = gr.themes.Soft(font=(gr.themes.LocalFont("Montserrat", weights=(400, 700)), "ui-sans-serif", "system-ui",
                             *CJK_FONTS, "sans-serif"))
