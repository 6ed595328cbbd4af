"""Small BPE tokenizers trained in memory, for tests of tokenization shortcuts against the real pipeline."""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

CORPUS = ["hello world, the fox is red and the owl is blue", "x<a>b x<a> <a>b ab", "one two three",
          "It's 2024: don't panic!! 3.14159 and 1,000 -- ok?\n\n\tindent  spaces   end"] * 50


def train_bpe(pre_tokenizer: Any, added: list[AddedToken], decoder: Any = None, *, dropout: float | None = None,
              normalizer: Any = None) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, dropout=dropout))
    tokenizer.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    if decoder is not None:
        tokenizer.decoder = decoder
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_tokens(added)
    return tokenizer
