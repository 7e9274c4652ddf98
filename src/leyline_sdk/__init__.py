"""Leyline SDK: directives, chat rendering, span diffing."""
