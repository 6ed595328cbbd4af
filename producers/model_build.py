"""Build the embedded reference model: a byte-level BPE tokenizer with a ChatML chat template and a tiny
Qwen2 causal LM, saved in Hugging Face format (``save_pretrained``) so that transformers and vLLM load it.

Everything is deterministic for a given torch/tokenizers build: the corpus comes from a seeded RNG, the
BPE trainer is deterministic for a fixed corpus, and the weights come from a seeded initialisation plus
a short supervised "format warm-up" (``producers.model_warmup``) on the toy lookup task defined here.
The warm-up exists for the demo: a random model cannot emit a parseable tool call, so online RL would
never see a reward. ``--warmup-steps 0`` gives the plain random-weight model.

Output directory: tokenizer.json, tokenizer_config.json, chat_template.jinja, config.json,
generation_config.json, model.safetensors and ``tokentrail_model.json`` (the build manifest: spec,
spec digest, fingerprints). A build is reused when the manifest's spec digest matches.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# 2: the template reads enable_thinking (chat_template_kwargs), as Qwen3's does.
# 3: tokenizer.json carries the normalizer and pre-tokenizer transformers runs for Qwen2 models.
BUILD_VERSION = 3
MANIFEST_NAME = "tokentrail_model.json"

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
# Hermes tool-call and reasoning markers: single added tokens, not special (as in Qwen2.5/Qwen3), so
# they survive skip_special_tokens when text is decoded.
MARKER_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
# Qwen2's pre-tokenizer split pattern. transformers (5.x) loads a ``qwen2`` model's tokenizer with it and an
# NFC normalizer whatever tokenizer.json says, so the built file says the same: the file (and its
# fingerprint) then describes what runs, under any transformers version and for ``tokenizers`` alone.
QWEN2_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                       r"|\s*[\r\n]+|\s+(?!\S)|\s+")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# ----------------------------------------------------------------------------------------- the toy task
# Words a demo task can use; each is a single token wherever the task puts it (asserted at build time).
TASK_KEYS = ("fox", "owl", "cat", "dog", "bee", "cow", "elk", "yak")
TASK_VALUES = ("red", "blue", "green", "gold", "pink", "gray", "black", "white")
TASK_SYSTEM_PROMPT = "Answer in one word."
LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up the value of a key.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
    },
}
# The key is quoted so that it is the same bare token in the question and in the call's JSON.
QUESTION_TEMPLATES = (
    'What is "{key}"?',
    'Look up "{key}".',
    'Find the value of "{key}".',
)


def task_question(key: str, variant: int = 0) -> str:
    return QUESTION_TEMPLATES[variant % len(QUESTION_TEMPLATES)].format(key=key)


def lookup_call(key: str, call_id: str = "call_0") -> dict[str, Any]:
    """The assistant message that calls the lookup tool, in OpenAI form."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"key": key})},
            }
        ],
    }


def task_messages(key: str, variant: int = 0) -> list[dict[str, Any]]:
    """The first call's messages of the lookup task (tools: ``[LOOKUP_TOOL]``)."""
    return [
        {"role": "system", "content": TASK_SYSTEM_PROMPT},
        {"role": "user", "content": task_question(key, variant)},
    ]


# --------------------------------------------------------------------------------------- chat template
# ChatML. Only {{- -}} / {%- -%} tags, so template whitespace never reaches the output; every emitted
# character comes from a string literal or a message. Reasoning is rendered for the last assistant
# message only: earlier reasoning is dropped, which breaks the token prefix between turns on purpose.
# ``enable_thinking=False`` (a request's chat_template_kwargs) opens an empty reasoning block after the
# generation prompt, as Qwen3's template does.
CHAT_TEMPLATE = r"""
{%- macro text_of(content) -%}
  {%- if content is none or content is undefined -%}
  {%- elif content is string -%}{{- content -}}
  {%- else -%}
    {%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_assistant=-1) -%}
{%- for message in messages -%}
  {%- if message.role == 'assistant' -%}{%- set ns.last_assistant = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}
{%- if tools or has_system -%}
  {{- '<|im_start|>system\n' -}}
  {%- if has_system -%}{{- text_of(messages[0].content) -}}{%- endif -%}
  {%- if tools -%}
    {%- if has_system -%}{{- '\n\n' -}}{%- endif -%}
    {{- '# Tools\n<tools>\n' -}}
    {%- for tool in tools -%}{{- tool | tojson -}}{{- '\n' -}}{%- endfor -%}
    {{- '</tools>' -}}
  {%- endif -%}
  {{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and message.role == 'system' -%}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- set reasoning = '' -%}
    {%- if message.reasoning_content is defined and message.reasoning_content -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif message.reasoning is defined and message.reasoning -%}
      {%- set reasoning = message.reasoning -%}
    {%- endif -%}
    {%- if loop.index0 == ns.last_assistant and reasoning -%}
      {{- '<think>\n' ~ reasoning ~ '\n</think>\n\n' -}}
    {%- endif -%}
    {%- set text = text_of(message.content) -%}
    {{- text -}}
    {%- if message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {%- if text or not loop.first -%}{{- '\n' -}}{%- endif -%}
        {{- '<tool_call>\n{"name": ' ~ (fn.name | tojson) ~ ', "arguments": ' -}}
        {%- if fn.arguments is string -%}{{- fn.arguments -}}
        {%- elif fn.arguments is defined and fn.arguments is not none -%}{{- fn.arguments | tojson -}}
        {%- else -%}{{- '{}' -}}
        {%- endif -%}
        {{- '}\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>tool\n' ~ text_of(message.content) ~ '<|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' ~ message.role ~ '\n' ~ text_of(message.content) ~ '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
""".strip()


# ------------------------------------------------------------------------------------------ build spec
@dataclass(frozen=True)
class BuildSpec:
    """Everything that determines the built files; its digest names a build in the manifest."""

    vocab_size: int = 512  # BPE target (byte alphabet + specials + merges); markers come on top
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4  # head_dim = hidden / heads = 32 (vLLM's CPU attention needs >= 32)
    max_positions: int = 8192
    seed: int = 0
    corpus_dialogues: int = 1500
    corpus_sentences: int = 1500
    warmup_steps: int = 600  # cap of the "copy" phase (it ends when its probe passes)
    warmup_dilute_steps: int = 60
    warmup_answer_copy: float = 0.3  # after the warm-up: how often the answer copies the tool result
    warmup_batch: int = 16
    warmup_lr: float = 3e-3

    def digest(self) -> str:
        payload = json.dumps({"build_version": BUILD_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


DEFAULT_SPEC = BuildSpec()

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


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


def task_dialogue(key: str, value: str, answer: str, variant: int = 0,
                  system: bool = True) -> list[dict[str, Any]]:
    """A whole two-call lookup dialogue: question, tool call, tool result ``value``, ``answer``."""
    head = task_messages(key, variant)
    return [
        *(head if system else head[1:]),
        lookup_call(key),
        {"role": "tool", "tool_call_id": "call_0", "content": value},
        {"role": "assistant", "content": answer},
    ]


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


def _jinja_render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """Render the template outside transformers (the tokenizer does not exist yet while its training
    corpus is made); the filters match transformers' chat-template environment."""
    return _compiled_template().render(messages=messages, tools=tools, add_generation_prompt=False)


@functools.cache
def _compiled_template() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    return env.from_string(CHAT_TEMPLATE)


# ---------------------------------------------------------------------------------------- tokenizer
def _train_tokenizer(spec: BuildSpec) -> Any:
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
    tokenizer.train_from_iterator(_corpus(spec, _jinja_render), trainer)
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
    _check_task_tokens(hf)
    return hf


def _check_task_tokens(tokenizer: Any) -> None:
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


# -------------------------------------------------------------------------------------------- model
def _make_model(spec: BuildSpec, tokenizer: Any) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_positions,
        # Untied: the trainer and the policy store handle a plain state dict with no shared tensors.
        tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    return Qwen2ForCausalLM(config)


# ------------------------------------------------------------------------------------- fingerprints
def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_manifest(model_dir: Path) -> dict[str, Any] | None:
    path = Path(model_dir) / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def is_built(model_dir: Path, spec: BuildSpec = DEFAULT_SPEC) -> bool:
    manifest = read_manifest(model_dir)
    return bool(manifest) and manifest.get("spec_digest") == spec.digest() and all(
        (Path(model_dir) / name).is_file() for name in manifest.get("files", {})
    )


# -------------------------------------------------------------------------------------------- build
def build_model(out_dir: Path, force: bool = False, spec: BuildSpec = DEFAULT_SPEC,
                progress: Progress = _quiet) -> Path:
    """Build (or reuse) the reference model in ``out_dir`` and return the directory.

    Concurrent builders serialise on a lock file next to the directory; the files appear atomically
    (built in a temporary sibling directory, then renamed into place)."""
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_built(out_dir, spec):
            progress(f"model already built in {out_dir} (spec {spec.digest()})")
            return out_dir
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
        try:
            _build_into(staging, spec, progress)
            for path in staging.iterdir():  # mkdtemp and some writers use 0600/0700
                path.chmod(0o644)
            staging.chmod(0o755)
            if out_dir.exists():
                retired = out_dir.with_name(f".{out_dir.name}-old-{os.getpid()}")
                out_dir.rename(retired)
                shutil.rmtree(retired)
            staging.rename(out_dir)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return out_dir


def _build_into(target: Path, spec: BuildSpec, progress: Progress) -> None:
    started = time.perf_counter()
    progress("training the byte-level BPE tokenizer")
    tokenizer = _train_tokenizer(spec)
    tokenizer.save_pretrained(target)
    progress(f"  vocab {len(tokenizer)} tokens ({time.perf_counter() - started:.1f} s)")
    progress("initialising the Qwen2 model")
    model = _make_model(spec, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    progress(f"  {params / 1e6:.2f}M parameters")
    if spec.warmup_steps > 0:
        progress(f"format warm-up: {spec.warmup_steps} steps")
    from producers.model_warmup import warm_up

    final_loss = warm_up(spec, model, tokenizer, progress)
    model.save_pretrained(target, safe_serialization=True)
    template_path = target / "chat_template.jinja"
    if not template_path.is_file() or template_path.read_text() != CHAT_TEMPLATE:
        raise RuntimeError("transformers did not save the chat template as chat_template.jinja")
    files = {p.name: sha256_file(p) for p in sorted(target.iterdir()) if p.is_file()}
    manifest = {
        "build_version": BUILD_VERSION,
        "spec": asdict(spec),
        "spec_digest": spec.digest(),
        "parameters": params,
        "vocab": len(tokenizer),
        "warmup_final_loss": final_loss,
        "tokenizer_fingerprint": files["tokenizer.json"],
        "chat_template_fingerprint": sha256_text(CHAT_TEMPLATE),
        "files": files,
        "token_ids": {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + MARKER_TOKENS},
    }
    (target / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    progress(f"built in {time.perf_counter() - started:.1f} s")


# ---------------------------------------------------------------------------------------------- CLI
def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="build and inspect the embedded reference model")
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION")
    build = sub.add_parser("build", help="build the tokenizer, chat template and tiny model (cached)")
    build.add_argument("--dir", type=Path, default=None,
                       help="output directory (default: settings model.dir)")
    build.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    build.add_argument("--warmup-steps", type=int, default=DEFAULT_SPEC.warmup_steps,
                       help="format warm-up steps (0: plain random weights)")
    build.set_defaults(func=_cmd_build)
    info = sub.add_parser("info", help="print the build manifest of the model directory")
    info.add_argument("--dir", type=Path, default=None, help="model directory (default: settings model.dir)")
    info.set_defaults(func=_cmd_info)
    parser.set_defaults(func=lambda _args: parser.print_help() or 2)


def _model_dir(arg: Path | None) -> Path:
    if arg is not None:
        return arg
    from tokentrail.settings import get_settings

    return get_settings().model.dir


def _cmd_build(args: argparse.Namespace) -> int:
    from tokentrail.cli import CliError

    if args.warmup_steps < 0:
        raise CliError("--warmup-steps must be >= 0")
    spec = BuildSpec(warmup_steps=args.warmup_steps)
    out = build_model(_model_dir(args.dir), force=args.force, spec=spec, progress=print)
    manifest = read_manifest(out) or {}
    print(json.dumps({k: manifest.get(k) for k in ("spec_digest", "parameters", "vocab",
                                                   "tokenizer_fingerprint", "chat_template_fingerprint")}))
    print(f"model directory: {out}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from tokentrail.cli import CliError

    directory = _model_dir(args.dir)
    manifest = read_manifest(directory)
    if manifest is None:
        raise CliError(f"no model in {directory}; run `tokentrail model build`")
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    return {t: int(tokenizer.convert_tokens_to_ids(t)) for t in SPECIAL_TOKENS + MARKER_TOKENS}


__all__: Sequence[str] = (
    "CHAT_TEMPLATE", "DEFAULT_SPEC", "LOOKUP_TOOL", "TASK_KEYS", "TASK_SYSTEM_PROMPT", "TASK_VALUES",
    "BuildSpec", "build_model", "is_built", "lookup_call", "read_manifest", "register", "task_messages",
    "task_question",
)
