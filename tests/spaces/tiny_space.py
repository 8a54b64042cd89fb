"""A tiny test space: 3 meshes x 2 per-device batches = 6 points; a model small enough that a
trial is mostly fixed costs (compile ~2 s, a few steps). Built by tests/space_factory.py."""
from paxsearch.tests.space_factory import tiny_space

STUDY, space = tiny_space()
