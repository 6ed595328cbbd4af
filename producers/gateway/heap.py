"""The garbage collector's settings while a gateway serves.

Measured on ``python -m bench.gateway`` (agent workload) with CPython's defaults, collections took about
0.5 ms of CPU a call, a tenth of the gateway's, and each full collection stalled the event loop for
0.3-0.5 s. Two causes:

* the young generation is collected after every 700 net new container objects, and every collection walks
  each live young container: the calls in flight hold prompt-id lists of thousands of ints (the upstream
  interface takes ``list[int]``), walked again at every collection, at c64 about a million references;
* a full collection walks the ~400k objects that importing torch and transformers and loading the tokenizer
  left behind, which live as long as the process anyway.

So while the app serves, every object that exists when it starts is frozen (``gc.freeze``: never scanned
again) and the young generation is collected after 20,000 net new containers: cyclic garbage waits a
little longer; reference counting frees everything else at once, as before. Both are undone on shutdown,
so a process that runs apps one after another (the tests) collects their objects as usual.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 20_000


@contextlib.contextmanager
def serving_heap(young_threshold: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Freeze what exists now and collect the young generation less often, until the block ends."""
    before = gc.get_threshold()
    # No collection first: there is no garbage at start-up to speak of (measured: none after loading),
    # and a full collection of a big test process would cost a third of a second per app.
    gc.freeze()
    gc.set_threshold(young_threshold, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
