"""Grouping keys (processors/baselines/keys.py): the first user message of each protocol's request, the
built-in cluster function, a pluggable one by dotted path, rollout fields, and what a missing key does."""

from __future__ import annotations

import orjson
import pytest

from processors.baselines.config import KeySpec
from processors.baselines.keys import (
    NONE_KEY,
    first_user_message,
    load_function,
    message_key,
    message_template,
    rollout_key,
)
from processors.errors import ConfigError


def shout(text: str) -> str:
    """A pluggable cluster function for the test: loaded by its dotted path."""
    return text.split()[0].upper()


def test_first_user_message_of_every_protocol() -> None:
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"},
                         {"role": "user", "content": "second"}]}
    parts = {"system": "x", "messages": [{"role": "user", "content": [{"type": "image"},
                                                                       {"type": "text", "text": "from parts"}]}]}
    assert first_user_message(orjson.dumps(chat).decode()) == "hello there"
    assert first_user_message(orjson.dumps(parts).decode()) == "from parts"  # Anthropic content blocks
    assert first_user_message('{"input": "responses api"}') == "responses api"
    assert first_user_message(orjson.dumps({"input": [{"role": "user", "content": "as items"}]}).decode()) == "as items"
    assert first_user_message('{"prompt": ["completions"]}') == "completions"
    assert first_user_message('{"messages": [{"role": "assistant", "content": "no user"}]}') is None
    assert first_user_message("not json") is None and first_user_message("") is None


def test_the_gateways_recorded_request_is_read_through_its_envelope() -> None:
    """A call record's ``request_json`` is the gateway's envelope (method, path, headers, body): the demo's
    lookup questions recorded by the gateway's own function cluster by template, one cluster per template."""
    from models.reference.task import task_messages
    from producers.gateway.records import request_json

    def recorded(key: str, variant: int) -> str:
        body = {"model": "tiny-chat", "messages": task_messages(key, variant), "user": "demo-user-1"}
        return request_json("POST", "/v1/chat/completions", "", {"authorization": "Bearer secret"}, body)

    assert first_user_message(recorded("fox", 0)) == 'What is "fox"?'
    spec = KeySpec()
    keys = {(key, variant): message_key(first_user_message(recorded(key, variant)), spec)
            for key in ("fox", "owl") for variant in range(3)}
    assert len(set(keys.values())) == 3 and None not in keys.values()
    assert keys[("fox", 1)] == keys[("owl", 1)] != keys[("fox", 2)]
    # An envelope whose body is not a request names no message.
    assert first_user_message(request_json("GET", "/v1/models", "", {}, None)) is None


def test_message_template_clusters_messages_that_differ_in_particulars() -> None:
    same = ["Fix the failing test in foo.py line 42", "fix the failing test in src/pkg/bar.py line 7",
            "Fix the failing test in 'tests/test_x.py' line 1000"]
    assert len({message_template(m) for m in same}) == 1
    assert message_template("Fix the failing build in foo.py line 42") != message_template(same[0])
    assert message_template("Write a haiku about autumn") != message_template(same[0])


def test_pluggable_function_by_dotted_path_and_its_errors() -> None:
    spec = KeySpec(function="tests.processors.baselines.test_keys:shout")
    assert message_key("deploy the service", spec) == "cluster:DEPLOY"
    assert load_function("tests.processors.baselines.test_keys.shout") is shout  # module.function works too
    assert message_key(None, spec) is None
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_function("tests.processors.baselines.test_keys:no_such_function")
    with pytest.raises(ConfigError, match="not callable"):
        load_function("processors.baselines.keys:NONE_KEY")


def test_rollout_fields_and_missing_keys() -> None:
    rollout = {"group_key": {"template": "bugfix"}, "task_input_json": '{"repository": "acme/api", "n": 3}',
               "metadata_json": "{}"}
    assert rollout_key(rollout, KeySpec(by="field", field="task_input.repository")) == "task_input.repository:acme/api"
    assert rollout_key(rollout, KeySpec(by="field", field="group_key.template")) == "group_key.template:bugfix"
    assert rollout_key(rollout, KeySpec(by="field", field="metadata.repository")) == NONE_KEY
    assert rollout_key(rollout, KeySpec(by="field", field="metadata.repository", missing="skip")) is None
    assert rollout_key(rollout, KeySpec(), "cluster:abc") == "cluster:abc"
    assert rollout_key(rollout, KeySpec(missing="skip"), None) is None
    with pytest.raises(ConfigError, match="must start with"):
        rollout_key(rollout, KeySpec(by="field", field="calls.0"))
