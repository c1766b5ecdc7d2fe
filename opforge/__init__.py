"""opforge: prove a PyTorch custom operator right before you ship it."""

__version__ = "0.1.0"
