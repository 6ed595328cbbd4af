"""The reference model's tokenizer: a byte-level BPE trained on a seeded corpus of task dialogues and filler
text, with the chat template's special and marker tokens, checked to keep the task words single tokens."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

from models.reference.harness_corpus import harness_texts
from models.reference.spec import BuildSpec
from models.reference.task import LOOKUP_TOOL, QUESTION_TEMPLATES, TASK_KEYS, TASK_VALUES, task_dialogue
from models.reference.template import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    MARKER_TOKENS,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    render_template,
)

# Qwen2's pre-tokenizer split pattern. transformers (5.x) loads a ``qwen2`` model's tokenizer with it and an
# NFC normalizer whatever tokenizer.json says, so the built file says the same: the file (and its
# fingerprint) then describes what runs, under any transformers version and for ``tokenizers`` alone.
QWEN2_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                       r"|\s*[\r\n]+|\s+(?!\S)|\s+")


# ------------------------------------------------------------------------------------------- corpus
_FILLER_TEXT = (
    "the a an and or but if then so of to in on at by for with from as is are was be it this that "
    "you we they I he she what which who how why when where yes no not please thank thanks hello "
    "world user assistant system tool call function answer question value key word one two three "
    "name arguments result lookup find look up data model token policy reward agent run test code "
    "python json string number object type properties required description true false null"
)
_FILLER_WORDS = _FILLER_TEXT.split()


def _random_sentence(rng: random.Random) -> str:
    words = [rng.choice(_FILLER_WORDS + list(TASK_KEYS + TASK_VALUES)) for _ in range(rng.randint(3, 12))]
    sentence = " ".join(words)
    return sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ":", ","])


def _corpus(spec: BuildSpec, render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]
            ) -> Iterator[str]:
    rng = random.Random(spec.seed)
    for _ in range(spec.corpus_dialogues):
        key, value, answer = rng.choice(TASK_KEYS), rng.choice(TASK_VALUES), rng.choice(TASK_VALUES)
        yield render(task_dialogue(key, value, answer, rng.randrange(len(QUESTION_TEMPLATES))), [LOOKUP_TOOL])
    for _ in range(spec.corpus_sentences):
        yield _random_sentence(rng)
        yield json.dumps({rng.choice(_FILLER_WORDS): rng.choice(TASK_VALUES + TASK_KEYS)})
        yield f"{rng.randint(0, 999)} {rng.choice(TASK_VALUES)}\n"


def training_texts(spec: BuildSpec) -> Iterator[str]:
    """The spec's corpus: the toy task's text, plus harness-like text for the ``harness`` corpus."""
    task = _corpus(spec, render_template)
    if spec.corpus == "task":
        return task
    if spec.corpus == "harness":
        return itertools.chain(task, harness_texts())
    raise ValueError(f"unknown corpus {spec.corpus!r} (task | harness)")


# ---------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(spec: BuildSpec) -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The markers must stay single tokens even inside training text, so they are not learnt by BPE.
    tokenizer.train_from_iterator(training_texts(spec), trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    # Trained on GPT-2's split; used, as transformers will use it, with Qwen2's (the same ids on the corpus).
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
    )
    hf.model_max_length = spec.max_positions
    check_task_tokens(hf)
    return hf


def check_task_tokens(tokenizer: Any) -> None:
    """Task words must be single tokens where the task puts them (at a line start and inside quotes),
    so answers are one sampled token and copying is token identity."""
    for word in TASK_KEYS + TASK_VALUES + ("lookup",):
        for text, expected in ((word, 1), (f'"{word}"', 3)):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) != expected:
                pieces = tokenizer.convert_ids_to_tokens(ids)
                raise RuntimeError(f"task word {word!r}: {text!r} tokenizes as {pieces}; raise vocab_size")
    for marker in SPECIAL_TOKENS + MARKER_TOKENS:
        if len(tokenizer.encode(marker, add_special_tokens=False)) != 1:
            raise RuntimeError(f"{marker} is not a single token")
