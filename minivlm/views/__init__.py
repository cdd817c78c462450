"""Views built on the engine, read-only: the event log replayed into snapshots and said in sentences (events.py),
the A/B/C cache study (cache_study.py). The engine never imports them."""
