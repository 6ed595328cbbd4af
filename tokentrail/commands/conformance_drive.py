"""Send the corpus through a running gateway and turn what it recorded into evidence for the judges.

Each conversation is one scripted rollout (the engine emits the family-format outputs of ``formats.py`` in
order, recorded ``scripted``); the calls go through the real ``openai`` SDK to the gateway's chat endpoint,
exactly as a harness sends them; the judges read the call records back from the calls topic, so what is
judged is what the gateway recorded, not what it returned.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from conformance.check import CallEvidence
from conformance.corpus import Conversation, Output, adapted, requests
from conformance.formats import FamilyFormat
from conformance.judge import normal_parse
from conformance.splits import sampled_split
from tokentrail.settings import Settings


def intended(out: Output) -> dict[str, Any]:
    return normal_parse(out.reasoning, out.content, [{"name": c.name, "arguments": c.arguments} for c in out.calls])


def run_conversation(url: str, model: str, conversation: Conversation, fmt: FamilyFormat,
                     text: Any = None) -> tuple[str, int, str]:
    """Send one conversation as a scripted rollout; returns (rollout id, calls answered, the failure or '').
    A call the gateway refuses ends the conversation there (the refusal is the failure; the calls before it
    are still judged). With the family's ``text`` side, the outputs are scripted as sampled splits
    (``conformance/splits.py``), else as the tokenizer encodes them."""
    import openai

    from producers.sdk import Rollout

    script: list[str | list[int]] = [fmt.write(step.output) for step in conversation.steps]
    if text is not None:
        script = [sampled_split(text.encode_text(str(s)), text.encode_text, text.renderer.decode, harmony=fmt.harmony)
                  for s in script]
    with Rollout(url, task_input={"conformance": fmt.family, "conversation": conversation.name},
                 script=script) as rollout:
        client = rollout.openai_client(max_retries=0, timeout=300)
        answered, failure = 0, ""
        for i, messages in enumerate(requests(conversation)):
            try:
                client.chat.completions.create(model=model, messages=messages, tools=list(conversation.tools),
                                               temperature=0)
            except openai.APIStatusError as exc:
                failure = f"{conversation.name} call {i}: HTTP {exc.status_code}: {str(exc.message)[:300]}"
                break
            answered += 1
        rollout.finish("FAILURE" if failure else "SUCCESS", {"conversation": conversation.name})
        return rollout.rollout_id, answered, failure


def recorded_calls(settings: Settings, topic: str, rollout_id: str, count: int,
                   timeout_s: float = 120.0) -> list[dict[str, Any]]:
    from tokentrail.commands.harnesses import _records

    calls = [r for _, r in _records(settings, topic, rollout_id, count, "CallRecord", timeout_s=timeout_s)]
    return sorted(calls, key=lambda r: r["call_index"])


def evidence(family: str, calls: Sequence[dict[str, Any]], text: Any,
             outputs: Sequence[Output] | None = None) -> list[CallEvidence]:
    """One rollout's calls as the judges see them; ``text`` is the gateway's text side of the family (its own
    conversion, decoding, parse and plain re-render: what the gateway did, not a judge)."""
    from schemas.tokens import unpack_ids
    from tokentrail.commands.harnesses import _prompts, conversation

    prompts = _prompts(list(calls))
    out: list[CallEvidence] = []
    previous: tuple[list[int], list[int]] | None = None
    for call, prompt in zip(calls, prompts, strict=True):
        body = json.loads(call["request_json"])["body"]
        messages, tools = conversation(call["protocol"], body)
        output_ids = unpack_ids(call["output_ids"]).tolist()
        output_text = text.decode(output_ids)
        parsed = text.parse(output_text)
        rerender = text.render_chat(messages, tools, prefix_mode="retokenize", prior=[])
        index = call["call_index"]
        out.append(CallEvidence(
            key=f"{call['rollout_id']}/{index}", family=family, messages=messages, tools=tools,
            prompt_ids=prompt.tolist(), output_ids=output_ids, output_text=output_text,
            gateway_parse=normal_parse(parsed.reasoning, parsed.content,
                                       [{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls]),
            rerender_ids=[int(i) for i in rerender.prompt_ids], previous=previous,
            intended=intended(outputs[index]) if outputs is not None and index < len(outputs) else None,
            chat_request=((body.get("messages") or [], body.get("tools")) if call["protocol"] == "openai.chat"
                          else None),
            anthropic_request=body if call["protocol"] == "anthropic.messages" else None))
        previous = (prompt.tolist(), output_ids)
    return out


def run_corpus(url: str, model: str, fmt: FamilyFormat, conversations: Sequence[Conversation], settings: Settings,
               calls_topic: str, text: Any) -> tuple[list[dict[str, Any]], list[CallEvidence], list[str]]:
    """(the recorded calls, their evidence, the failures), every conversation's in turn."""
    records: list[dict[str, Any]] = []
    found: list[CallEvidence] = []
    failures: list[str] = []
    for conv in conversations:
        conv = adapted(conv, fmt.can)
        rollout_id, count, failure = run_conversation(url, model, conv, fmt, text)
        failures += [failure] if failure else []
        calls = recorded_calls(settings, calls_topic, rollout_id, count) if count else []
        if len(calls) != count:
            failures.append(f"{conv.name}: {len(calls)} of {count} calls on {calls_topic}")
        records += calls
        found += evidence(fmt.family, calls, text, [s.output for s in conv.steps])
    return records, found, failures
