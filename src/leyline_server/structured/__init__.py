"""Constrained decoding, engine-neutral: JSON schemas as decoding can enforce them, tool calls as structural tags."""
