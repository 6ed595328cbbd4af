"""The ``model`` settings section (``TOKENTRAIL_MODEL__*``): where the reference model lives."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from schemas.local_paths import VAR_DIR


class ModelSettings(BaseModel):
    # The embedded reference model (built locally, random weights; `tokentrail model build`).
    dir: Path = VAR_DIR / "models" / "tiny-chat"
    name: str = "tokentrail-tiny"
    # The build spec of the model in ``dir`` (models.reference.spec.SPECS): "tiny" (the demo's) or "harness".
    # A gateway on the harness variant: spec "harness", dir = harness_dir, name = harness_name.
    spec: str = "tiny"
    # The harness variant (spec "harness": 16K vocabulary, 64K positions), where real harness prompts fit;
    # its own directory, so building it never replaces the demo's model.
    harness_dir: Path = VAR_DIR / "models" / "harness-chat"
    harness_name: str = "tokentrail-harness"
    # A model family (models/families.FAMILIES: qwen3, qwen3-coder, llama3, gpt-oss) built in ``dir`` and
    # served with its real tokenizer, chat template and parser; "" serves the reference model of ``spec``.
    family: str = ""
    # Model families (`tokentrail model build --family F`, models/families): each in families_dir/F.
    families_dir: Path = VAR_DIR / "models" / "families"
    # gpt-oss: the harmony system message's "Current date" (YYYY-MM-DD); "" renders today's (UTC) date, as vLLM
    # does without VLLM_SYSTEM_START_DATE (pin it where prompts must not change at midnight).
    harmony_start_date: str = ""
