"""rlx: the CLI and the engine (compose → validate → build → loop → track)."""
