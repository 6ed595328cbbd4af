"""The tokentrail gateway: OpenAI- and Anthropic-protocol HTTP server that records every model call.

``create_app`` (app.py) wires the protocol adapters, the rollout registry, the upstream engine and the
call publisher into one ASGI app; ``running_gateway`` (testing.py) serves it on a free port for tests.
"""
