"""The vision tower's outputs: what to encode, when, and how long they are kept."""
