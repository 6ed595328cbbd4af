"""The gateway's standard wiring: the upstream, the model's text side and the Kafka publisher, made from
the settings sections the gateway reads, into one ASGI app.

``tokentrail gateway`` (the shell) serves ``build_app``'s app with uvicorn; tests build the same app
(see testing.py). The reference model is built if it is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from producers.gateway.settings import GatewaySettings, GatewayStackSettings


def make_upstream(settings: GatewayStackSettings, progress: Any = print, version_loader: Any = None) -> Any:
    """The embedded reference engine (building the model if needed) or a vLLM client.

    With ``version_loader`` (the shell gives one when settings ``weight_sync.release_servers`` is on) the vLLM
    fleet serves several policy versions at once, one per server, loaded by it (docs/release-vllm.md)."""
    spec = settings.gateway.upstream.strip()
    if spec == "embedded":
        from producers.upstreams.embedded.engine import EmbeddedEngine

        model_dir = build_configured_model(settings, progress)
        return EmbeddedEngine(model_dir, max_resident_versions=settings.gateway.max_resident_versions)
    if version_loader is not None:
        from producers.upstreams.vllm_versions import VersionedVLLMUpstream

        return VersionedVLLMUpstream.from_settings(settings.gateway, version_loader)
    from producers.upstreams.vllm import VLLMUpstream

    return VLLMUpstream.from_settings(settings.gateway)


def make_text_side(settings: GatewayStackSettings, progress: Any = print) -> Any:
    from producers.gateway.family_text_side import text_side_for

    if settings.gateway.upstream.strip() == "embedded" or settings.model.family:
        build_configured_model(settings, progress)
    text = text_side_for(settings.model.dir, fast_ascii=settings.gateway.fast_ascii_tokenize,
                         caches=cache_budgets(settings.gateway), harmony_start_date=settings.model.harmony_start_date)
    fast = text.renderer.token_cache.ascii_encoder is not None
    progress("ASCII text is tokenized by the exact fast path" if fast else
             "the tokenizer tokenizes all text (fast ASCII path off by setting, or not covered for this tokenizer)")
    return text


def build_configured_model(settings: GatewayStackSettings, progress: Any = print) -> Path:
    """Build (or reuse) the model settings ``model`` name: a family's (``model.family``) or the reference
    model of ``model.spec``, in ``model.dir``."""
    from models.families.build import build_family
    from models.families.spec import family_named
    from models.reference.build import build_model
    from models.reference.spec import spec_named

    if settings.model.family:
        return build_family(settings.model.dir, family_named(settings.model.family), progress=progress)
    return build_model(settings.model.dir, spec=spec_named(settings.model.spec), progress=progress)


def cache_budgets(gateway: GatewaySettings) -> Any:
    """The text side's cache budgets (``producers.render_caches.CacheBudgets``) from the gateway settings."""
    from producers.render_caches import CacheBudgets

    return CacheBudgets(gateway.token_cache_max_bytes, gateway.render_memo_max_bytes, gateway.output_memo_max_bytes)


def build_app(settings: GatewayStackSettings, *, upstream: Any = None, publisher: Any = None, text: Any = None,
              progress: Any = print, policy_dir: Path | None = None, release_topic: str | None = None,
              **create_kwargs: Any) -> Starlette:
    """The standard app: given parts are used as they are, missing ones are made from ``settings``.

    With ``policy_dir`` (the trainer's policy store) an upstream that can follows the published versions.
    With ``gateway.follow_releases`` each rollout is served the version its release assigns, the decisions
    read from ``release_topic`` (default tokentrail.release-decisions)."""
    from producers.delivery import CallPublisher
    from producers.gateway.app import create_app

    text = text if text is not None else make_text_side(settings, progress)
    upstream = upstream if upstream is not None else make_upstream(settings, progress)
    if settings.gateway.follow_releases:
        upstream = release_routed(settings, upstream, release_topic)
    publisher = publisher if publisher is not None else CallPublisher.from_settings(settings.kafka, settings.gateway)
    create_kwargs.setdefault("close_upstream", True)
    create_kwargs.setdefault("recovery", make_recovery_source(settings, create_kwargs.get("topics")))
    create_kwargs.setdefault("progress", progress)
    return create_app(settings, upstream, publisher, text, policy_dir=policy_dir, **create_kwargs)


def release_routed(settings: GatewayStackSettings, upstream: Any, topic: str | None = None) -> Any:
    """``upstream`` behind the release's routing, following the decisions of the settings' release track."""
    from producers.gateway.release_routed import ReleaseRoutedUpstream
    from schemas.kafka.release_follower import ReleaseFollower
    from schemas.topics import RELEASE_DECISIONS_TOPIC

    model = settings.gateway.release_model or settings.model.name
    follower = ReleaseFollower(settings.kafka, model, topic or RELEASE_DECISIONS_TOPIC).start()
    return ReleaseRoutedUpstream(upstream, follower)


def make_recovery_source(settings: GatewayStackSettings, topics: dict[str, str] | None = None) -> Any:
    """What a starting gateway reads to rebuild its open attempts (recovery.py); None when turned off."""
    from producers.gateway.recovery import KafkaRecoverySource
    from schemas.kafka.config import consumer_config
    from schemas.topics import CALLS_TOPIC, ENV_TOPIC

    g = settings.gateway
    if not g.recover_on_start:
        return None
    topics = topics or {}
    return KafkaRecoverySource(consumer_config(settings.kafka, "tokentrail-gateway-recovery"),
                               topics.get("calls_topic", CALLS_TOPIC), topics.get("env_topic", ENV_TOPIC),
                               g.recovery_lookback_s, g.recovery_timeout_s)
