"""Leyline server."""
