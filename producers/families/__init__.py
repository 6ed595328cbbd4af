"""Per-family output formats and message preparation for the gateway's text side (``models/families``).

``formats``: parse a family's sampled text with a well-kept library (``renderers`` 0.1.12's
``parse_response``; ``openai-harmony`` for gpt-oss), answered as the family's reference server (vLLM with
that family's parser) answers when the markup does not parse. ``messages``: the request's messages as
vLLM hands them to the chat template. ``stream``: reasoning/content deltas by re-parsing the growing text.
"""
