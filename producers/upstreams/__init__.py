"""Model upstreams behind the gateway (each implements producers.upstream.Upstream)."""
