"""Tessera: multimodal LLM serving with the encoder split from the language model."""

__version__ = "0.1.0"
