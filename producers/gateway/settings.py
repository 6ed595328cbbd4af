"""The ``gateway`` settings section (``TOKENTRAIL_GATEWAY__*``), read by the gateway and its upstreams, and
``GatewayStackSettings``: the sections the gateway's wiring reads, which the shell's settings provide."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field, SecretStr, field_validator

from models.settings import ModelSettings
from producers.gateway.session_refs import DEV_SESSION_REF_KEY
from schemas.kafka.config import KafkaSettings
from schemas.local_paths import VAR_DIR


class GatewaySettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8400
    # Gateway worker processes on the one port (`tokentrail gateway --processes`; producers/gateway/peers.py):
    # each session's calls are served by one owner, the others pass them on. 1: a single process, no routing.
    processes: int = Field(default=1, ge=1, le=64)
    # "embedded" or a vLLM base URL list, comma separated (rollout-sticky routing).
    upstream: str = "embedded"
    # vLLM upstream: served model name (empty: the first of /v1/models), the server's --logprobs-mode
    # (raw_logprobs | processed_logprobs; recorded on every call) and its API key.
    vllm_model: str = ""
    # Harness model names mapped to the served model (Claude Code sends its own names; "*" maps all).
    model_aliases: dict[str, str] = Field(default_factory=dict)
    vllm_logprobs_mode: str = "raw_logprobs"
    vllm_api_key: str = ""
    spool_dir: Path = VAR_DIR / "spool"
    # "record": calls with no rollout are recorded as unattributed; "refuse": 400.
    unattributed: str = "record"
    # Organic sessions (sessions.py): a call that names no rollout but carries a session key (a harness
    # session header, OpenAI `user`, Anthropic `metadata.user_id`) joins the key's current session window:
    # a rollout of its own, "session-<key hash>-<window hash>", which ends on POST /v1/sessions/{key}/end or
    # after session_idle_s with no call, so it completes like any rollout. Off by default: it changes what
    # such calls are recorded under (rollout "unattributed" today) and puts starts and finishes on the
    # environment topic.
    organic_sessions: bool = False
    # Keep it below attempt_idle_timeout_s, which would otherwise drop the attempt unfinished first.
    session_idle_s: float = Field(default=900.0, gt=0)
    # Where an organic session's key comes from, first match in this order (sessions.py); "api_key": the
    # API key the caller presented stands for its tenant (hashed; never the admin key), for deployments
    # whose auth proxy gives each tenant its key. E.g. TOKENTRAIL_GATEWAY__SESSION_KEY_SOURCES='["api_key"]'.
    session_key_sources: list[Literal["headers", "openai.user", "anthropic.metadata.user_id", "api_key"]] = Field(
        default=["headers", "openai.user", "anthropic.metadata.user_id"], min_length=1)
    # "splice": reuse exact sampled ids of earlier outputs; "retokenize": render history from text;
    # "upstream": pass-through, the upstream (vLLM, or the embedded engine) renders chats itself and the
    # gateway records the prompt ids it reports.
    prefix_mode: Literal["splice", "retokenize", "upstream"] = "splice"
    # Tokenize ASCII text with the exact fast path (producers/ascii_encoder.py) where the tokenizer
    # qualifies; false: always with the tokenizer itself (same ids, about 5x the CPU).
    fast_ascii_tokenize: bool = True
    # Byte budgets of the text side's caches (LRU each; 0 turns one off; /health "text_caches" shows what
    # they hold): ids of texts tokenized before, reused for the prompts that extend them
    # (producers/token_cache.py); rendered chat texts by conversation, for a group's rollouts that send the
    # same one; decoded outputs, which every later call of an attempt looks at (producers/rendering.py).
    # Size them for the conversations in flight: 32 MiB of token cache holds about 64 conversations of 16k
    # tokens (ids, text and cut points: about 20 bytes a token of ASCII text).
    token_cache_max_bytes: int = Field(default=32 * 1024 * 1024, ge=0)
    render_memo_max_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    output_memo_max_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    max_body_bytes: int = 8 * 1024 * 1024
    # Bodies of at least offload_body_bytes are parsed and measured against the context in a pool of
    # body_check_processes processes before the event loop parses them (producers/gateway/body_checks.py): a
    # body of tens of thousands of tiny objects no longer holds every other call on the worker while it is
    # refused. At most body_check_queue such bodies wait per gateway process; more get 503 overloaded.
    # 0 (either): every body is parsed on the event loop.
    offload_body_bytes: int = Field(default=256 * 1024, ge=0)
    body_check_processes: int = Field(default=1, ge=0, le=16)
    body_check_queue: int = Field(default=4, ge=1)
    max_tokens_limit: int = 4096
    # Authentication (docs/operations.md, "Security"). Set (TOKENTRAIL_GATEWAY__ADMIN_KEY): every route but
    # /health and /metrics needs a key. Starting rollouts needs this admin key; model calls, events, finish
    # and status need the attempt's own key (minted by POST /v1/rollouts) or this key; calls that name no
    # rollout need this key. Empty: no keys, and `tokentrail gateway` listens on loopback only.
    admin_key: str = ""
    # Tenants of organic traffic (tenants.py): tenant name -> its API key, e.g.
    # TOKENTRAIL_GATEWAY__TENANT_KEYS='{"acme": "sk-..."}'. A tenant key may make calls that name no rollout
    # (with the admin key set too); its sessions, their ends and its feedback stay within the tenant.
    tenant_keys: dict[str, str] = Field(default_factory=dict)
    # The secret every value derived from a session key is an HMAC under (producers/gateway/session_refs.py):
    # the session_ref in AttemptStarted, the window's rollout id, the route tag. Set it from the operator's secret
    # store (TOKENTRAIL_GATEWAY__SESSION_REF_KEY, the same on every process and replica); the default is DEV-ONLY
    # and public. Rotating it: docs/feedback.md, "Session refs and key rotation".
    session_ref_key: SecretStr = SecretStr(DEV_SESSION_REF_KEY)
    # Open organic session windows per tenant; beyond it a new session is refused (429 tenant_session_limit).
    tenant_max_open_sessions: int = Field(default=1000, gt=0)
    # Deprecated: keys are on whenever admin_key is set. Alone (no admin key) it still turns on the attempts'
    # keys for model calls and the attempt routes, but starting rollouts stays open.
    require_auth: bool = False
    delivery_timeout_s: float = 5.0
    # Memory the attempt registry may keep (kept prompts and outputs for delta encoding and splicing,
    # starts, tombstones), in bytes; over it the least recently used idle state is shed (attempts.py).
    registry_max_bytes: int = Field(default=512 * 1024 * 1024, ge=1024 * 1024)
    # An unfinished attempt with no call or event for this long is abandoned: its state and key are
    # dropped and later calls on it get a 410 (attempt_expired).
    attempt_idle_timeout_s: float = Field(default=6 * 3600.0, gt=0)
    # The attempts' API keys are an HMAC of their ids under this secret, so a restarted gateway or another
    # replica recognizes them (keys.py). Empty: derived from admin_key, else a random secret kept in
    # <spool_dir>/attempt-key-secret. Replicas behind one load balancer need the same secret.
    key_secret: str = ""
    # Rebuild unfinished attempts from Kafka on start (recovery.py): a restarted or redeployed gateway
    # keeps serving the harnesses mid-session. The look-back bounds how far back their starts are read.
    recover_on_start: bool = True
    recovery_lookback_s: float = Field(default=6 * 3600.0, gt=0)
    # How long start-up may spend on it (draining the spool first, then reading); past it nothing is
    # rebuilt and calls on earlier attempts get a 404, as before.
    recovery_timeout_s: float = Field(default=120.0, gt=0)
    # Follow the release decisions (tokentrail.release-decisions, docs/release.md): each rollout is served
    # the policy version its release assigns (sticky by rollout id) and /health shows the plan followed.
    # The release track is release_model, empty: model.name.
    follow_releases: bool = False
    release_model: str = ""
    # Who may route a call to a pinned version with x-tokentrail-traffic-label (evaluation traffic): the
    # admin key, or this key in x-tokentrail-label-key (TOKENTRAIL_GATEWAY__TRAFFIC_LABEL_KEY). With neither
    # key set (no authentication at all) every caller may; otherwise a label from anyone else is refused.
    traffic_label_key: str = ""
    # The embedded engine keeps the weights of at most this many versions in memory (LRU), more only when
    # the release serves more at once.
    max_resident_versions: int = Field(default=4, ge=1)


    @field_validator("session_ref_key")
    @classmethod
    def _ref_key_not_empty(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value():  # an empty HMAC key: every ref computable from the key (issue 29 #8)
            raise ValueError("gateway.session_ref_key must not be empty")
        return value


class GatewayStackSettings(Protocol):
    """The settings sections a gateway is built from (``tokentrail.settings.Settings`` has them)."""

    gateway: GatewaySettings
    model: ModelSettings
    kafka: KafkaSettings
