"""One look for every plotly figure of the app, in the light and the dark page theme alike: transparent paper and
plot backgrounds (the page's own colour shows through), grey grid lines that read on both, and dark text that the
page's CSS (panels/page.py) turns light in dark mode, so a figure follows the theme without a server round trip."""
import copy

import plotly.io as pio

CLEAR = "rgba(0,0,0,0)"
GRID = "rgba(128,128,128,0.3)"  # a grid line grey that shows on white and on the dark theme's near-black
TEXT = "#2b2f36"  # titles, ticks, legend (the CSS makes them light in dark mode)
# Chinese text in a font that has it wherever the page runs: Noto Sans CJK (Debian's fonts-noto-cjk, the
# Dockerfile's), then what macOS, Windows and other Linux desktops ship; never the boxes of a font without it
CJK_FONTS = ["Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "PingFang SC", "Hiragino Sans GB",
             "Microsoft YaHei", "WenQuanYi Micro Hei"]
# plotly's own fonts, then the Chinese ones, for the figures' titles, legends and hover texts
FONT = ", ".join(['"Open Sans"', "verdana", "arial", *(f'"{f}"' for f in CJK_FONTS), "sans-serif"])

# the app's template: plotly's own colours and fonts, on the page's own background. It is every figure's default
# (set when panels is imported), so a figure gets it at construction as it got plotly's, at no extra cost per frame
TEMPLATE = copy.deepcopy(pio.templates["plotly"])
TEMPLATE.layout.update(paper_bgcolor=CLEAR, plot_bgcolor=CLEAR, font=dict(color=TEXT, family=FONT), legend=dict(bgcolor=CLEAR),
                       modebar=dict(bgcolor=CLEAR, color="#888", activecolor="#555"))
for axis in ("xaxis", "yaxis"):
    TEMPLATE.layout[axis].update(gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
pio.templates["minivlm"] = TEMPLATE
pio.templates.default = "minivlm"
