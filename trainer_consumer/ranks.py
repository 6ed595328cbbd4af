"""The trainer's torch.distributed process group: who this rank is, its device and backend, and the few
collectives the ranks use to stay in lock-step (hand out one step's shares, gather every rank's report).

Backend from the device, by the same code: NCCL when the rank has a CUDA device, gloo on CPU. The group
is the one ``torchrun`` describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT);
``RankGroup.single()`` is the one-process case, with no process group at all.

The timeout is long on purpose: ranks other than 0 wait in ``scatter`` for as long as the samples topic
is idle. A dead rank does not hang the others for that long: ``torchrun`` sees its exit and stops and
restarts the whole group (``--max-restarts``).

Closing the group first releases what holds it from C++ (the DDP wrapper's reducer): see ``close``.
"""

from __future__ import annotations

import datetime
import gc
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 24 * 3600.0


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(local_rank: int) -> torch.device:
    """This rank's device: its local GPU when there is one, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _attempt_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The rendezvous store, its keys under this attempt's prefix. Under torchrun the agent hosts the store
    and keeps it across restarts of the group: without the prefix a restarted group reads the dead group's
    addresses and gloo waits forever to connect to them (seen with torch 2.13, --standalone)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]), world_size,
                          is_master=rank == 0 and not agent, timeout=timeout, multi_tenant=not agent)
    return dist.PrefixStore(f"tokentrail/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


@dataclass
class RankGroup:
    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str = ""  # "" when there is no process group (one process)
    _releases: list[weakref.WeakMethod[Callable[[], None]]] = field(default_factory=list, repr=False)

    @classmethod
    def single(cls) -> RankGroup:
        return cls()

    @classmethod
    def from_env(cls, timeout_s: float = DEFAULT_TIMEOUT_S) -> RankGroup:
        """Joins the group ``torchrun`` (or a test's spawner) described in the environment; one process
        when WORLD_SIZE is unset or 1."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return cls.single()
        device = rank_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = backend_for(device)
        if not dist.is_initialized():
            rank = int(os.environ["RANK"])
            timeout = datetime.timedelta(seconds=timeout_s)
            dist.init_process_group(backend, store=_attempt_store(rank, world_size, timeout), rank=rank,
                                    world_size=world_size, timeout=timeout,
                                    **({"device_id": device} if device.type == "cuda" else {}))
        return cls(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device, backend=backend)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def scatter(self, items: list[T] | None) -> T:
        """Rank 0 hands ``items[r]`` to rank r (the others pass None) and gets ``items[0]``."""
        if not self.distributed:
            assert items is not None
            return items[0]
        out: list[Any] = [None]
        dist.scatter_object_list(out, items if self.is_leader else None, src=0)
        return out[0]  # type: ignore[no-any-return]

    def gather(self, item: T) -> list[T]:
        """Every rank's ``item``, in rank order, on every rank. Returns only once every rank has called
        it: after a step, the barrier that says every rank has finished it."""
        if not self.distributed:
            return [item]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, item)
        return out

    def barrier(self) -> None:
        if self.distributed:
            self.gather(None)

    def on_close(self, release: Callable[[], None]) -> None:
        """``release`` (a bound method, held weakly) runs in ``close`` before the process group goes: it
        drops what holds the group from C++, such as a DDP wrapper."""
        self._releases.append(weakref.WeakMethod(release))

    def close(self) -> None:
        """Destroys the process group, after dropping (and collecting) everything else that holds it.

        Why the order matters (torch 2.13, gloo): the last reference to a gloo group runs its destructor,
        which joins the group's worker threads. A worker that has just finished a collective still drops
        that collective's tensors, and dropping a tensor that Python has seen takes the GIL. Python's own
        handle releases the GIL before it runs the destructor, but a DDP reducer (freed with the learner)
        does not: when the reducer held the last reference, the rank hung for good, the main thread
        holding the GIL and joining a worker waiting for it. Releasing the wrappers first leaves the last
        reference to ``destroy_process_group``."""
        for release in self._releases:
            method = release()
            if method is not None:
                method()
        self._releases.clear()
        gc.collect()  # wrappers caught in reference cycles too
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()
