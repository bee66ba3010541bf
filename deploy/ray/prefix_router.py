"""A Ray Serve request router that sends requests sharing a prompt prefix to the same mica
replica, so that replica's prefix cache keeps hitting (mica reuses the KV blocks of any
prompt prefix it has seen; another replica would compute them again).

Ray's own prefix-aware router (``ray.serve.llm.request_router.PrefixCacheAffinityRouter``)
needs the ``ray[llm]`` extra (pyarrow, ...); this one uses only Ray Serve's public
``RequestRouter`` interface. It ranks replicas by rendezvous hashing of the prompt's first
``prefix_chars`` characters: each (prefix, replica) pair gets a hash score and the highest
scoring replica is preferred. Adding or removing a replica (autoscaling) moves only the
prefixes whose preferred replica changed, not all of them, as a plain ``hash % n`` would.
Load still counts: when the preferred replica has ``imbalance`` more requests in flight
than the least loaded one, the least loaded goes first. Prompts shorter than
``prefix_chars`` have little to reuse and go to the least loaded replica.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, List, Optional

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)


def request_text(pending: Optional[PendingRequest]) -> Optional[str]:
    """The prompt text of a request: its first argument's ``routing_text()``."""
    if pending is None:
        return None
    for arg in pending.args:
        fn = getattr(arg, "routing_text", None)
        if callable(fn):
            return fn()
    return None


def score(prefix: str, replica_id: str) -> int:
    """The rendezvous-hashing score of a replica for a prefix (stable across processes)."""
    h = hashlib.blake2b(f"{replica_id}\x00{prefix}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Prefers the replica that owns a request's prompt prefix (see the module docs)."""

    def initialize_state(self, prefix_chars: int = 256, imbalance: int = 8, **_: Any) -> None:
        self.prefix_chars = prefix_chars
        self.imbalance = imbalance

    def _load(self, r: RunningReplica) -> int:
        q = self.replica_queue_len_cache.get(r.replica_id)
        return 0 if q is None else q

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_load = sorted(candidate_replicas, key=lambda r: (self._load(r), random.random()))
        text = request_text(pending_request)
        if text is None or len(text) < self.prefix_chars:
            return [[r] for r in by_load]
        prefix = text[: self.prefix_chars]
        ranked = sorted(candidate_replicas,
                        key=lambda r: score(prefix, r.replica_id.unique_id), reverse=True)
        owner = ranked[0]
        if self._load(owner) - self._load(by_load[0]) >= self.imbalance:
            return [[r] for r in by_load]
        return [[r] for r in ranked]
