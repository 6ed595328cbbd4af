"""The variables a chat template reads that a request may set (``chat_template_kwargs``), and those it may not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from producers.rendered_prompt import RenderError

# Template variables the renderer itself sets (or that steer rendering): a request may not set them.
RESERVED_TEMPLATE_VARIABLES = frozenset({
    "messages", "tools", "add_generation_prompt", "continue_final_message", "documents", "chat_template",
    "tokenize", "return_dict", "return_assistant_tokens_mask", "conversation"})
# Names Jinja and transformers give every template; a request may not shadow them.
PROVIDED_TEMPLATE_NAMES = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace",
                                      "raise_exception", "strftime_now"})


def check_template_kwargs(requested: Mapping[str, Any]) -> None:
    """Refuse (RenderError) template variables a request may not set: the renderer sets them itself."""
    reserved = sorted(set(requested) & RESERVED_TEMPLATE_VARIABLES)
    if reserved:
        raise RenderError(f"chat_template_kwargs may not set {', '.join(reserved)}: the gateway sets them itself")


def template_variables(template: str) -> frozenset[str] | None:
    """The variables ``template`` reads but does not set itself (a request may supply them), less the
    names Jinja and transformers provide (helpers such as ``raise_exception``, ``range``); None where the
    template uses syntax a plain Jinja parser does not know (e.g. transformers' ``{% generation %}``)."""
    import jinja2
    from jinja2 import meta

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        names = meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:
        return None
    return frozenset(names - PROVIDED_TEMPLATE_NAMES - RESERVED_TEMPLATE_VARIABLES)
