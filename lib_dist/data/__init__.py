"""Data for single-device training, all available offline and deterministic.

- `digits`: scikit-learn's bundled 8x8 handwritten digits (no download), split train/test;
- `corpus`: English text built from the docstrings of Python's own standard library;
- `tokenizer`: a character-level tokenizer;
- `batching`: reproducible, resumable streams of mini-batches, of examples or of token windows.
"""

from .batching import ExampleBatches, TokenBatches, split_tokens
from .corpus import CORPUS_FILES, Corpus, build_corpus
from .digits import Digits, load_digits
from .tokenizer import CharTokenizer

__all__ = ["CORPUS_FILES", "CharTokenizer", "Corpus", "Digits", "ExampleBatches",
           "TokenBatches", "build_corpus", "load_digits", "split_tokens"]
