"""``POST /v1/admin/forget`` (admin key): forget a subject from the gateway (issue 31, docs/forgetting.md).

Destroys the subject's data keys and publishes its ``Forgotten`` event (``schemas.kafka.forget_log``), then
drops what this gateway keeps of the subject in memory (kept prompts and outputs, task inputs). The spool
holds the subject's records sealed (they are written through the codec's sealer), so destroying the key
shreds them there too. ClickHouse forgets when its sink stores the event (or ``tokentrail forget`` blanks it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from producers.gateway.body import validate
from producers.gateway.context import GatewayContext
from producers.gateway.errors import GatewayError
from producers.gateway.identity import is_admin, presented_key
from schemas.codec import process_sealer
from schemas.kafka.config import KafkaSettings
from schemas.kafka.forget_log import forget_name
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore


class ForgetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subject: str = Field(min_length=1, max_length=200)
    requested_by: str = Field(default="gateway admin", min_length=1, max_length=200)
    reason: str = Field(default="", max_length=2000)
    request_id: str | None = Field(default=None, min_length=1, max_length=100)


class ForgetApi:
    def __init__(self, ctx: GatewayContext, kafka: KafkaSettings, settings: ForgetSettings) -> None:
        self.ctx, self.kafka, self.settings = ctx, kafka, settings
        self._store: KafkaKeyStore | None = None

    def routes(self) -> list[Route]:
        return [Route("/v1/admin/forget", self.forget, methods=["POST"])]

    def key_store(self) -> KafkaKeyStore:
        sealer = process_sealer()
        if sealer is not None and isinstance(sealer.keyring, KafkaKeyStore):
            return sealer.keyring  # the one this gateway seals with: its cache forgets at once
        if self._store is None:
            self._store = KafkaKeyStore(self.kafka, self.settings)
        return self._store

    async def forget(self, request: Request) -> JSONResponse:
        try:
            if self.ctx.admin_key and not is_admin(presented_key(request.headers), self.ctx.admin_key):
                raise GatewayError(401, "forgetting a subject needs the gateway admin key", "authentication",
                                   code="invalid_api_key")
            body = validate(ForgetRequest, await self.ctx.body_checks.read_json(request, self.ctx.max_body_bytes,
                                                                                 model=ForgetRequest))
            try:  # the name given is hashed as the gateway hashes the subjects it writes (subject_names.py)
                events: list[dict[str, Any]] = await asyncio.to_thread(
                    forget_name, self.key_store(), self.kafka, self.settings, body.subject,
                    requested_by=body.requested_by, reason=body.reason, request_id=body.request_id)
            except RuntimeError as exc:
                raise GatewayError(503, f"the forget could not be stored ({exc}); retry", "unavailable",
                                   code="forget_failed") from exc
        except GatewayError as exc:
            return JSONResponse(exc.body("env"), status_code=exc.status)
        cleared = sum(self.ctx.registry.forget_subject(subject) for subject in self.ctx.subjects.forms(body.subject))
        # The pseudonym's event, and those of the name as older records carry it (forget_log.forget_name).
        return JSONResponse({**events[0], "also_forgotten": events[1:], "gateway_states_cleared": cleared},
                            status_code=200)
