"""The embedded engine: slot pool, radix cache, transformers forward, splice."""
