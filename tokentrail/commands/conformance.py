"""``tokentrail conformance``: the real harnesses and the conformance corpus on every model family (issue 28).

Per family (``models/families``: built if needed) a gateway of its own on the family's tiny model; through it
the corpus (``conformance/corpus.py``, one scripted rollout per conversation over OpenAI chat) and
each harness's scripted task (``tokentrail harnesses check``'s: Claude Code, Codex CLI, Pi, OpenClaw; its
script written in the family's output format). Every recorded call is judged by implementations we did not
write (``conformance/judge.py``): ``renderers`` for the prompt ids (vLLM's chat render where renderers has no
renderer of the family), vLLM's parser of the family for the parsed outputs (one batch in vLLM's environment
at the end). Prints the matrix harness x family, then one
JSON line of the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from conformance.check import CallEvidence, judge_calls, parse_jobs, render_jobs
from conformance.corpus import CONVERSATIONS, Output, ToolCall
from conformance.formats import FORMATS, FamilyFormat
from conformance.matrix import Cell, extends, summary, table
from tokentrail.settings import Settings, get_settings

DEFAULT_HARNESSES = ("claude", "codex", "pi", "openclaw")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("conformance", help="harnesses x model families, judged by renderers and vLLM")
    parser.add_argument("--families", default=",".join(FORMATS), help="comma-separated families")
    parser.add_argument("--harnesses", default=",".join(DEFAULT_HARNESSES),
                        help="comma-separated harnesses ('' for none)")
    parser.add_argument("--no-corpus", action="store_true", help="skip the corpus rollouts")
    parser.add_argument("--no-vllm", action="store_true",
                        help="skip vLLM's parsers and chat render (no parse comparison, no vLLM render judge)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per harness run")
    parser.add_argument("--calls-topic", default=None, help="calls topic (default: tokentrail's)")
    parser.add_argument("--env-topic", default=None, help="env topic (default: tokentrail's)")
    parser.add_argument("--json-out", type=Path, default=None, help="also write every cell's figures here")
    parser.set_defaults(func=_cmd)


def _names(value: str) -> list[str]:
    return [n.strip() for n in value.split(",") if n.strip()]


def harness_script(script: list[str], fmt: FamilyFormat) -> list[str]:
    """A harness's scripted completions (hermes format, ``tokentrail harnesses check``'s) in ``fmt``."""
    from producers.parsing import parse_output

    out = []
    for text in script:
        parsed = parse_output(text)
        calls = tuple(ToolCall(c.name, json.loads(c.arguments)) for c in parsed.tool_calls)
        out.append(fmt.write(Output(content=parsed.content or "", calls=calls)))
    return out


def family_cell(harness: str, family: str, calls: list[dict[str, Any]], evidence: list[CallEvidence], text: Any,
                reproduced: list[bool | None]) -> Cell:
    """The cell's counts from the calls (one rollout at a time, in call order) and the judges' verdicts."""
    from tokentrail.commands.harness_breaks import break_causes

    cell = Cell(harness, family, calls=len(calls))
    for i, (call, e) in enumerate(zip(calls, evidence, strict=True)):
        exact = reproduced[i]
        if exact is None:  # no independent renderer: the harness check's own rule
            # The whole prompt decoded, special tokens and all (``text.decode`` is for outputs: it drops stop
            # tokens, and a prompt's turn ends are stop tokens, so it never equals the render).
            rendered = text.render_text(e.messages, e.tools)
            exact = text.renderer.decode(e.prompt_ids) == rendered and (call["spliced_outputs"] > 0
                                                                        or e.prompt_ids == e.rerender_ids)
        cell.token_exact += bool(exact and call["status"] == "OK")
        cell.parse_failures += bool(text.parse(e.output_text).errors)
        if e.previous is None:
            continue
        cell.pairs += 1
        if extends(e.previous[0] + e.previous[1], e.prompt_ids):
            cell.spliced += 1
            continue
        named = list(call["prefix_breaks"]) or break_causes(evidence[i - 1].messages,
                                                           text.parse(evidence[i - 1].output_text), e.messages)
        if named:
            cell.named_breaks += [f"{e.key}: {n}" for n in named]
        else:
            cell.unnamed_breaks.append(e.key)
    return cell


class FamilyRun:
    """One family's gateway, with its text side and independent renderer."""

    def __init__(self, family: str, settings: Settings, topics: dict[str, str], stack: Any) -> None:
        from models.families.build import build_family
        from models.families.spec import family_named
        from producers.gateway.family_text_side import FamilyTextSide
        from testkit.gateway import running_embedded_gateway

        self.family, self.fmt = family, FORMATS[family]
        self.model = f"tokentrail-{family}"
        self.model_dir = build_family(settings.model.families_dir / family, family_named(family), progress=print)
        # gpt-oss's system message carries a date: one date for the whole run (gateway and judge), so a run
        # across midnight compares like with like.
        date = settings.model.harmony_start_date or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        served = settings.model_copy(update={"model": settings.model.model_copy(
            update={"family": family, "dir": self.model_dir, "name": self.model, "harmony_start_date": date})})
        self.text = FamilyTextSide.from_dir(self.model_dir, harmony_start_date=date)
        spool = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"tokentrail-conformance-{family}-"))
        self.gateway = stack.enter_context(running_embedded_gateway(served, spool_dir=spool, topics=topics,
                                                                    text=self.text, model_aliases={"*": self.model}))
        self.renderer = independent_renderer(self.fmt, self.model_dir, start_date=date)


def independent_renderer(fmt: FamilyFormat, model_dir: Path, *, start_date: str | None = None) -> Any:
    """``renderers``' renderer of the family over the family's tokenizer.json (None: renderers has none)."""
    if fmt.renderer is None:
        return None
    from transformers import AutoTokenizer

    from conformance.judge import IndependentRenderer
    from producers.families.formats import use_local_harmony_vocab

    kwargs = {}
    if fmt.harmony:  # renderers' gpt-oss renderer is harmony's encoder: its o200k from the build, not the network
        use_local_harmony_vocab(model_dir)
        if start_date:
            kwargs["conversation_start_date"] = start_date
    return IndependentRenderer(fmt.renderer, AutoTokenizer.from_pretrained(str(model_dir)), kwargs)


def _cmd(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from conformance.vllm_parsers import judge_with_vllm
    from schemas.kafka.topic_admin import ensure_gateway_topics
    from schemas.topics import CALLS_TOPIC, ENV_TOPIC
    from tokentrail.commands.conformance_drive import evidence, recorded_calls, run_corpus
    from tokentrail.commands.harnesses import HARNESSES, _records, _rollout_status, _run

    settings = get_settings()
    families, harnesses = _names(args.families), _names(args.harnesses)
    unknown = [f for f in families if f not in FORMATS] + [h for h in harnesses if h not in HARNESSES]
    if unknown:
        print(f"unknown families/harnesses: {', '.join(unknown)}")
        return 2
    topics = {"calls_topic": args.calls_topic or CALLS_TOPIC, "env_topic": args.env_topic or ENV_TOPIC}
    ensure_gateway_topics(settings.kafka, **topics)
    pending: list[tuple[Cell, list[CallEvidence], list[dict[str, Any]], FamilyRun]] = []
    started = time.monotonic()
    with ExitStack() as stack:
        for family in families:
            run = FamilyRun(family, settings, topics, stack)
            print(f"{family}: gateway {run.gateway.url} on {run.model_dir}", flush=True)
            if not args.no_corpus:
                calls, found, failures = run_corpus(run.gateway.url, run.model, run.fmt, CONVERSATIONS, settings,
                                                    topics["calls_topic"], run.text)
                pending.append((Cell("corpus", family, run_failure="; ".join(failures)), found, calls, run))
                print(f"{family}: corpus, {len(found)} calls ({time.monotonic() - started:.0f} s)", flush=True)
            for name in harnesses:
                base = HARNESSES[name]
                harness = type(base)(base.name, base.protocol, harness_script(base.script, run.fmt), base.command)
                print(f"{family}: {name} ...", flush=True)
                rollout_id, finished, failure = _run(harness, run.gateway.url, run.model, args.timeout_s)
                calls = recorded_calls(settings, topics["calls_topic"], rollout_id, int(finished["call_count"]))
                env = _records(settings, topics["env_topic"], rollout_id, 2)
                status = _rollout_status(env, calls, rollout_id)
                cell = Cell(name, family)
                cell.run_failure = failure or ("" if status == "COMPLETE" else f"rollout {status or 'not assembled'}")
                pending.append((cell, evidence(family, calls, run.text), calls, run))
                print(f"{family}: {name}, {len(calls)} calls{', ' + failure if failure else ''}", flush=True)
        every = [e for _, found, _, _ in pending for e in found]
        dirs = {r.family: r.model_dir for _, _, _, r in pending}
        renderers = {r.family: r.renderer for _, _, _, r in pending}
        vllm, vllm_renders = ({}, {}) if args.no_vllm else judge_with_vllm(
            parse_jobs(every, FORMATS, dirs), render_jobs(every, FORMATS, dirs, renderers), env=_harmony_env(pending))
        cells = []
        for cell, found, calls, run in pending:
            tally, reproduced = judge_calls(found, run.renderer, vllm, vllm_renders)
            counted = family_cell(cell.harness, cell.family, calls, found, run.text, reproduced)
            counted.tally, counted.run_failure = tally, cell.run_failure
            cells.append(counted)
    print(table(cells))
    if args.json_out:
        args.json_out.write_text(json.dumps([c.row() for c in cells], indent=1))
    print(json.dumps({**summary(cells, families, (["corpus"] if not args.no_corpus else []) + harnesses),
                      "seconds": round(time.monotonic() - started, 1)}))
    return 0 if all(c.passed for c in cells) else 1


def _harmony_env(pending: list[tuple[Cell, list[CallEvidence], list[dict[str, Any]], FamilyRun]]) -> dict[str, str]:
    """openai-harmony (in vLLM's environment too) reads o200k_base from the gpt-oss build, never the network."""
    dirs = [r.model_dir for _, _, _, r in pending if r.family == "gpt-oss"]
    return {"TIKTOKEN_ENCODINGS_BASE": str(dirs[0]), "TIKTOKEN_RS_CACHE_DIR": str(dirs[0])} if dirs else {}
