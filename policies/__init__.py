"""Leyline policies."""
