"""Data files shipped with the SDK (the tiny tokenizer)."""
