"""Model engines behind the ``Upstream`` protocol (the embedded reference engine lives here)."""
