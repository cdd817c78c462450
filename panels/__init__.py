"""The app's tabs, one file each, built on the public minivlm API (see app.py)."""
from panels import theme  # noqa: F401  (first: every figure made in any panel gets the app's template)
