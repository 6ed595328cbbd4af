"""Values of a CallRecord's ``error.type`` that readers act on (the rest are free-form, for people)."""

# The client closed the connection before the response was complete (HTTP 499 in the record). The call is
# recorded with what was sampled, but it says nothing about the policy: the release controller counts it apart,
# never as the policy's error (a caller could otherwise abort streams to force a rollback).
CLIENT_DISCONNECTED = "client_disconnected"
