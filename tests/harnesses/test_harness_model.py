"""The harness model variant (issue 18, item 2): a byte-level BPE trained on harness-like text, 64K positions;
real harness prompts fit with room to spare; the demo's default model is unchanged by the variant's fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from models.reference.build import is_built
from models.reference.fingerprint import read_manifest
from models.reference.harness_corpus import CAPTURED_DIR
from models.reference.spec import DEFAULT_SPEC, HARNESS_SPEC, spec_named
from producers.gateway.anthropic_adapter import conversation
from producers.gateway.body import validate
from producers.gateway.models_anthropic import MessagesRequest
from producers.rendering import ChatRenderer

pytestmark = pytest.mark.e2e

# The default build's digest before the variant existed: its cached builds and manifests stay valid.
DEFAULT_DIGEST = "9e330c0598420548"


def test_the_default_spec_is_unchanged_and_specs_are_named() -> None:
    assert DEFAULT_SPEC.digest() == DEFAULT_DIGEST and "corpus" not in DEFAULT_SPEC.as_dict()
    assert spec_named("tiny") == DEFAULT_SPEC and spec_named("harness") == HARNESS_SPEC
    assert HARNESS_SPEC.digest() != DEFAULT_DIGEST
    with pytest.raises(ValueError, match="unknown model spec 'huge'; known: harness, tiny"):
        spec_named("huge")


def test_real_harness_prompts_fit_the_harness_model(harness_model_dir: Path) -> None:
    config = AutoConfig.from_pretrained(str(harness_model_dir))
    assert config.max_position_embeddings >= 65_536 and 8_000 <= config.vocab_size <= 32_000
    manifest = read_manifest(harness_model_dir)
    assert manifest is not None and manifest["spec"]["corpus"] == "harness" and manifest["corpus_sha256"]
    assert is_built(harness_model_dir, HARNESS_SPEC)
    renderer = ChatRenderer(harness_model_dir)
    for run in ("claude", "claude-tool"):
        for line in (CAPTURED_DIR / f"{run}.jsonl").read_text().splitlines():
            body = json.loads(line)["body"]
            messages, tools = conversation(validate(MessagesRequest, body))
            ids = renderer.render(messages, tools)
            # ~49 K characters: 31 K tokens under the tiny model's 516-token vocabulary, well under 16 K here,
            # with room for the harness's next turns; the full text, never truncated.
            assert len(ids) < 16_000 and len(ids) * 4 < config.max_position_embeddings
            assert renderer.decode(ids) == renderer.render_text(messages, tools)
