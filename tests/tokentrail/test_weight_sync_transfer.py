"""Every weight sync the shell builds moves weights the way ``weight_sync.transfer`` says: the gateway's, the
standalone ``tokentrail weight-sync``'s and the release router's (``weight_sync.release_servers``) all take
``WeightSyncSettings.sync_options``. Before, the standalone and the release router's syncs ignored the setting
and ran ``WeightSync``'s own default (the group delta), so the default ``scatter`` never reached them.

Unit level: the syncs are built, not run (no server is asked anything); what a transfer does is the sync's own
tests' (tests/trainer_consumer/weight_sync) and the live ones'."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from models.policy_store import PolicyStore
from tokentrail.commands.weight_sync import fleet_sync
from tokentrail.runtime.vllm_versions import release_servers_upstream
from tokentrail.runtime.weight_sync import gateway_upstream
from tokentrail.settings import Settings
from trainer_consumer.weight_sync import WeightSync
from trainer_consumer.weight_sync.settings import WeightSyncSettings

SERVERS = "http://127.0.0.1:9,http://127.0.0.1:10"  # never asked: the syncs are only built
# The default, and every other value with a dtype and time-out that are not the defaults either.
SECTIONS = [WeightSyncSettings(),
            *(WeightSyncSettings(transfer=t, engine_dtype="bfloat16", timeout_s=7.0)  # type: ignore[arg-type]
              for t in ("elements", "delta", "full"))]


def settings_with(section: WeightSyncSettings, tmp_path: Path, **weight_sync: object) -> Settings:
    base = Settings()
    return base.model_copy(update={
        "weight_sync": section.model_copy(update=weight_sync),
        "gateway": base.gateway.model_copy(update={"upstream": SERVERS}),
        "trainer": base.trainer.model_copy(update={"checkpoint_dir": tmp_path / "policies"})})


def assert_follows(sync: WeightSync, section: WeightSyncSettings) -> None:
    assert (sync.transfer, sync.engine_dtype) == (section.transfer, getattr(torch, section.engine_dtype))
    assert all(admin._timeout_s == section.timeout_s for admin in sync._admins.values())
    asyncio.run(sync.close())


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.transfer)
def test_the_standalone_sync_takes_the_transfer_from_the_settings(section: WeightSyncSettings, tmp_path: Path) -> None:
    settings = settings_with(section, tmp_path)
    sync = fleet_sync(settings, SERVERS.split(","), PolicyStore(tmp_path / "policies"), tmp_path / "base",
                      log=lambda _line: None)
    assert sync.pause_mode == "wait"  # no engine versions recorded: in-flight updates would go unrecorded
    assert_follows(sync, section)


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.transfer)
def test_the_release_routers_sync_takes_the_transfer_from_the_settings(section: WeightSyncSettings,
                                                                       tmp_path: Path) -> None:
    settings = settings_with(section, tmp_path, release_servers=True, in_gateway=True, engine_versions=True)
    upstream = release_servers_upstream(settings, base_dir=tmp_path / "base")
    assert upstream.trainer_sync.pause_mode == "wait"  # a call routed for a version is sampled by it alone
    assert_follows(upstream.trainer_sync, section)


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.transfer)
def test_the_gateways_sync_takes_the_transfer_from_the_settings(section: WeightSyncSettings, tmp_path: Path) -> None:
    upstream = gateway_upstream(settings_with(section, tmp_path, in_gateway=True, engine_versions=True))
    assert upstream.sync.pause_mode == section.pause_mode
    assert_follows(upstream.sync, section)
