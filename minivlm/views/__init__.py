"""Views built on the engine: snapshots, the event log's replay and sentences, prompt anatomy, the prefix tree, the A/B/C cache study."""
