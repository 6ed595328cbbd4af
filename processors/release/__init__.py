"""Safe policy release, the pure core: the release plan, the sequential test, sticky routing, the
controller's rules and state, and the ReleaseDecision events (docs/release.md). No I/O in here."""
