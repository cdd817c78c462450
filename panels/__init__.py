"""The app's tabs, one file each, built on the public minivlm API (see app.py)."""
