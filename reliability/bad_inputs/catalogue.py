"""Every catalogue of the corpus together: the gateway's HTTP cases in the order the runner sends them, and the
corpus's size."""

from __future__ import annotations

from reliability.bad_inputs.anthropic_cases import anthropic_cases
from reliability.bad_inputs.config_cases import config_cases, verifier_cases
from reliability.bad_inputs.env_cases import env_cases
from reliability.bad_inputs.http_case import HttpCase
from reliability.bad_inputs.openai_cases import openai_cases
from reliability.bad_inputs.openclaw_cases import openclaw_cases
from reliability.bad_inputs.responses_cases import responses_cases
from reliability.bad_inputs.security_cases import security_cases
from reliability.bad_inputs.topic_cases import topic_cases


def http_cases(model: str) -> list[HttpCase]:
    return [*openai_cases(model), *responses_cases(model), *anthropic_cases(model), *openclaw_cases(model),
            *env_cases()]


def corpus_size(model: str = "m") -> int:
    return (len(http_cases(model)) + len(security_cases(model)) + len(topic_cases()) + len(config_cases())
            + len(verifier_cases()))
