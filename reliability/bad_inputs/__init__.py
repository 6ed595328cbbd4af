"""The bad-input corpus: one table row per bad input, each stating what the system must answer; one module per
catalogue (``openai_cases``, ``responses_cases``, ``anthropic_cases``, ``openclaw_cases``, ``env_cases``,
``security_cases``, ``topic_cases``, ``config_cases``; ``catalogue`` joins them).

Four kinds of case, each a frozen dataclass:

* ``HttpCase``   a request to the gateway (OpenAI, Anthropic or environment API) and the status and
                 error shape it must get back in the caller's protocol;
* ``TopicCase``  a record put on an input topic of the stream processors, and the dead-letter record
                 (stage, error type, reason) the worker must write — or, for prompt deltas that cannot
                 be rebuilt, the INCOMPLETE rollout naming the reason — plus what the ClickHouse sink
                 must dead-letter when it reads the same record;
* ``ConfigCase`` a configuration (reward / credit / sample / grouping YAML, a verifier spec) that must
                 be refused with a typed ``ConfigError`` whose message names the problem;
* ``VerifierCase`` a verifier that crashes, hangs or dies, whose Score must carry ERROR / TIMEOUT;
* ``SecurityCase`` a request to a gateway that requires keys: missing or wrong keys, another rollout's
                 key, management without the admin key, credentials that must be stored redacted, a
                 streamed body over the size limit.

``gap`` marks a case where the gateway's current answer is not the protocol's (the case states the
right answer; runners report these separately so they are seen, not hidden).

Placeholders in HttpCase paths: ``{live}`` is ``<rollout>/attempts/<attempt>`` of an attempt that
stays open during the corpus, ``{done}`` the same for an attempt finished before it.
"""
