"""The one interface every model upstream implements: token ids in, token ids + logprobs out.

The gateway renders the conversation to prompt ids itself (pinned tokenizer and chat template), so
every upstream — the embedded reference engine or a vLLM server — is asked to continue exact ids.

Pass-through (the gateway's ``prefix_mode = "upstream"``) is the one exception: an upstream that also
implements ``ChatUpstream`` is given the conversation, renders it with its own chat template, and
reports the prompt ids it ran (on its first chunk and in the result), which the gateway records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from schemas.tokens import TokenIds
from schemas.version_spans import PolicySpan

LogprobKind = Literal["RAW", "PROCESSED"]


@dataclass(frozen=True)
class ReleaseAssignment:
    """Where a release plan routed a call (the record's ``release``; docs/release.md)."""

    release_id: str
    decision_sequence: int  # the ReleaseDecision sequence the routing followed
    arm: str  # serving | candidate | pinned
    pin_label: str | None = None  # the pin that chose the version (arm pinned)

    def as_record(self) -> dict[str, Any]:
        return {"release_id": self.release_id, "decision_sequence": int(self.decision_sequence),
                "arm": self.arm, "pin_label": self.pin_label}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerateRequest:
    # The gateway passes its read-only uint32 array: a 4k-id prompt is not worth turning into a list of
    # Python ints for an upstream that sends it on as JSON or as a tensor.
    prompt_ids: TokenIds
    sampling: Sampling
    request_id: str
    # Routing key: every call of a rollout goes to the same upstream replica (prefix-cache locality).
    rollout_id: str = ""
    # Scripted output: emit exactly these ids (up to max_tokens) instead of sampling, each with the model's
    # own logprob (RAW: before temperature, top-k and top-p); a test's way to make a harness take a path.
    # Only an upstream with ``supports_forced_output`` can; others refuse it (400).
    forced_ids: tuple[int, ...] | None = None
    # The policy version that must serve this request (a release routes sessions to versions); None: the
    # upstream's current one. An upstream that keeps several versions (the embedded engine) honours it;
    # the result's policy_version is always the one that produced the tokens.
    policy_version: int | None = None
    # The user's session, the key a release routes by (the rollout id, or the harness session of calls
    # that name no rollout); empty: the rollout id.
    session_key: str = ""
    # The release traffic label the caller sent (evaluation traffic); a pinned label gets its pinned version.
    traffic_label: str | None = None


@dataclass(frozen=True)
class ChatGenerateRequest:
    """Pass-through: the conversation in the internal (OpenAI chat) form, for the upstream to render."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: Sampling
    request_id: str
    rollout_id: str = ""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    policy_version: int | None = None  # as GenerateRequest.policy_version
    session_key: str = ""  # as GenerateRequest.session_key
    traffic_label: str | None = None  # as GenerateRequest.traffic_label


@dataclass
class TokenChunk:
    """Newly sampled ids (usually one) with their rollout logprobs, as they are produced."""

    ids: list[int]
    logprobs: list[float]
    # Pass-through: the prompt ids the upstream rendered and ran, on the first chunk.
    prompt_ids: TokenIds | None = None


@dataclass
class GenerateResult:
    prompt_ids: TokenIds  # what the engine actually ran (must equal the request's for token-in)
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    logprob_kind: LogprobKind
    policy_version: int
    engine: str  # e.g. "embedded/0.1" or "vllm/0.33.0"
    upstream: str  # URL or name of the replica that served it
    queue_ms: float = 0.0
    first_token_ms: float = 0.0
    total_ms: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)
    # Pass-through: the fingerprint of the chat template the upstream rendered with, where it knows it.
    chat_template_fingerprint: str = ""
    # Which policy version sampled which output tokens, where the engine says so and a weight update
    # landed mid-call (``policy_version`` is then the first token's); empty: all from ``policy_version``.
    version_spans: tuple[PolicySpan, ...] = ()
    # The release arm that served the call, when a release plan routed it (producers/gateway/release_routed.py).
    release: ReleaseAssignment | None = None


class UpstreamError(Exception):
    """The upstream refused or failed a request; ``status_code`` follows HTTP conventions."""

    def __init__(self, message: str, status_code: int = 502, error_type: str = "upstream_error") -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_type = error_type


class Upstream(Protocol):
    name: str

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        """Yields TokenChunk objects as tokens are sampled, then exactly one final GenerateResult."""
        ...

    async def policy_version(self) -> int: ...

    async def close(self) -> None: ...


class ChatUpstream(Upstream, Protocol):
    """An upstream that can also render a conversation itself (pass-through)."""

    def generate_chat_stream(self, request: ChatGenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        """As ``generate_stream``; the first chunk (or, without one, the result) carries the prompt ids."""
        ...


class WholeOrStreamed:
    """A generation stream that can be told, before its first item, that nobody needs tokens as they
    are sampled (a harness that did not ask to stream, no stop string to watch): the upstream then asks
    for the whole answer in one response, which costs far less than a stream of per-token events, and
    yields only the final GenerateResult (ids and logprobs in it).

    ``streamed`` and ``whole`` make the two kinds of request; neither starts before the first item."""

    def __init__(self, streamed: Callable[[], AsyncIterator[TokenChunk | GenerateResult]],
                 whole: Callable[[], Awaitable[GenerateResult]]) -> None:
        self._streamed, self._whole = streamed, whole
        self._prefer_whole = False
        self._items: AsyncIterator[TokenChunk | GenerateResult] | None = None

    def prefer_whole(self) -> None:
        if self._items is None:
            self._prefer_whole = True

    def __aiter__(self) -> WholeOrStreamed:
        return self

    async def __anext__(self) -> TokenChunk | GenerateResult:
        if self._items is None:
            self._items = self._one_result() if self._prefer_whole else self._streamed()
        return await self._items.__anext__()

    async def _one_result(self) -> AsyncIterator[TokenChunk | GenerateResult]:
        yield await self._whole()

    async def aclose(self) -> None:
        close = getattr(self._items, "aclose", None)
        if close is not None:
            await close()
