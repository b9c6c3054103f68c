"""lib_dist.data: the digits split, the offline corpus, the tokenizer and the batch streams."""

from __future__ import annotations

import pytest
import torch

from lib_dist.data import (CORPUS_FILES, CharTokenizer, ExampleBatches, TokenBatches,
                           build_corpus, load_digits, split_tokens)


def test_digits_split_is_stratified_deterministic_and_scaled():
    d = load_digits(test_fraction=0.2, seed=0)
    assert len(d.x_train) + len(d.x_test) == 1797 and d.n_features == 64 and d.n_classes == 10
    assert 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
    per_class = torch.bincount(torch.cat([d.y_train, d.y_test]))
    train_share = torch.bincount(d.y_train) / per_class
    # stratified: each class's share is 0.8 up to a whole example of that class
    assert ((train_share - 0.8).abs() <= 1 / per_class).all()
    again, other = load_digits(seed=0), load_digits(seed=1)
    assert torch.equal(d.x_test, again.x_test) and not torch.equal(d.y_test, other.y_test)
    with pytest.raises(ValueError):
        load_digits(test_fraction=1.0)


def test_corpus_is_deterministic_printable_prose():
    corpus = build_corpus()
    assert corpus.text == build_corpus().text and len(corpus.sha256) == 64
    assert corpus.text.startswith("The Zen of Python, by Tim Peters\n\nBeautiful is better")
    assert len(corpus) > 150_000 and corpus.missing == [] and corpus.files == list(CORPUS_FILES)
    assert set(corpus.text) <= {chr(c) for c in range(32, 127)} | {"\n"}
    assert "Return" in corpus.text  # docstrings


def test_corpus_from_another_stdlib_lists_what_is_missing(tmp_path):
    (tmp_path / "this.py").write_text('s = """Ornhgvshy vf orggre."""\nd = {}\n')
    (tmp_path / "textwrap.py").write_text(
        '"""Wrap\ttext."""\ndef f():\n    """D\u00e9j\u00e0."""\n')
    corpus = build_corpus(tmp_path)
    assert corpus.text == "Beautiful is better.\n\nWrap    text.\n\nDj."
    assert corpus.files == ["this.py", "textwrap.py"] and "argparse.py" in corpus.missing
    with pytest.raises(FileNotFoundError):
        build_corpus(tmp_path / "empty")


def test_char_tokenizer_round_trip():
    tok = CharTokenizer("hello world")
    assert tok.chars == sorted(set("hello world")) and tok.vocab_size == 8
    ids = tok.encode("low hell")
    assert ids.dtype == torch.int64 and tok.decode(ids) == "low hell"
    with pytest.raises(KeyError, match="'z' is not in the vocabulary"):
        tok.encode("lord z")


def test_example_batches_cover_each_epoch_once_and_resume():
    x, y = torch.arange(10).float()[:, None], torch.arange(10)
    batches = ExampleBatches(x, y, batch_size=3, seed=4)
    epoch = [next(batches) for _ in range(batches.batches_per_epoch)]
    seen = torch.cat([b[1] for b in epoch])
    assert len(seen) == 9 and len(set(seen.tolist())) == 9  # no repeats; one left over
    assert all(torch.equal(bx[:, 0].long(), by) for bx, by in epoch)
    state = batches.state_dict()
    ahead = [next(batches)[1] for _ in range(4)]
    resumed = ExampleBatches(x, y, batch_size=3, seed=0)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, next(resumed)[1]) for a in ahead)
    with pytest.raises(ValueError):
        ExampleBatches(x, y[:5], 2)


def test_token_batches_are_shifted_windows_and_resume():
    tokens = torch.arange(100)
    stream = TokenBatches(tokens, block_size=8, batch_size=4, seed=1)
    x, y = next(stream)
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1) and torch.equal(x[:, 1:], x[:, :-1] + 1)  # contiguous windows
    state = stream.state_dict()
    nxt = next(stream)
    other = TokenBatches(tokens, 8, 4, seed=99)
    other.load_state_dict(state)
    assert torch.equal(next(other)[0], nxt[0])
    assert not torch.equal(next(TokenBatches(tokens, 8, 4, seed=2))[0], x)


def test_split_tokens_is_contiguous():
    train, val = split_tokens(torch.arange(1000), val_fraction=0.1)
    assert torch.equal(train, torch.arange(900)) and torch.equal(val, torch.arange(900, 1000))
    with pytest.raises(ValueError):
        split_tokens(torch.arange(10), 0.0)
