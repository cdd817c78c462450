"""Speculative decoding: draft proposers (n-gram prompt lookup)."""
