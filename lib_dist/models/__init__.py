"""Models the course trains: a multilayer perceptron, a tiny character-level GPT, and the bigram
counts they are compared with."""

from .bigram import bigram_logits
from .gpt import GPT, GPTConfig
from .mlp import MLP

__all__ = ["GPT", "GPTConfig", "MLP", "bigram_logits"]
