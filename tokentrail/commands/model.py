"""``tokentrail model build | info``: build and inspect the embedded reference model (``models.reference``)
in the directory the ``model`` settings section names, unless ``--dir`` gives another."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from models.families.build import build_family
from models.families.spec import FAMILIES, family_named
from models.reference.build import build_model
from models.reference.fingerprint import read_manifest
from models.reference.spec import DEFAULT_SPEC, SPECS, spec_named
from tokentrail.errors import CliError
from tokentrail.settings import get_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="build and inspect the embedded reference model")
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION")
    build = sub.add_parser("build", help="build the tokenizer, chat template and tiny model (cached)")
    build.add_argument("--dir", type=Path, default=None,
                       help="output directory (default: settings model.dir)")
    build.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    build.add_argument("--spec", choices=sorted(SPECS), default="tiny",
                       help="tiny: the demo's model (default); harness: a 16K-vocabulary, 64K-context "
                            "random-weight variant that real harness prompts fit in")
    build.add_argument("--warmup-steps", type=int, default=None,
                       help=f"format warm-up steps (0: plain random weights; default: the spec's, "
                            f"{DEFAULT_SPEC.warmup_steps} for tiny)")
    build.add_argument("--family", choices=sorted(FAMILIES), default=None,
                       help="build a model family instead: its real vocabulary and chat template, and a tiny "
                            "random-weight model of its architecture (models/families; default dir: "
                            "settings model.families_dir/FAMILY)")
    build.set_defaults(func=_cmd_build)
    info = sub.add_parser("info", help="print the build manifest of the model directory")
    info.add_argument("--dir", type=Path, default=None, help="model directory (default: settings model.dir)")
    info.set_defaults(func=_cmd_info)
    parser.set_defaults(func=lambda _args: parser.print_help() or 2)


def _model_dir(arg: Path | None, spec_name: str = "tiny") -> Path:
    if arg is not None:
        return arg
    settings = get_settings().model
    return settings.harness_dir if spec_name == "harness" else settings.dir


def _cmd_build(args: argparse.Namespace) -> int:
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise CliError("--warmup-steps must be >= 0")
    if args.family is not None:
        return _build_family(args)
    configured = get_settings().model
    if configured.family and args.dir is None and args.spec == "tiny":
        # The settings serve a family from model.dir: build that family there (building the reference model
        # into model.dir would replace the family's model that the settings serve)
        args.family, args.dir = configured.family, configured.dir
        return _build_family(args)
    spec = spec_named(args.spec)
    if args.warmup_steps is not None:
        spec = replace(spec, warmup_steps=args.warmup_steps)
    out = build_model(_model_dir(args.dir, args.spec), force=args.force, spec=spec, progress=print)
    manifest = read_manifest(out) or {}
    print(json.dumps({k: manifest.get(k) for k in ("spec_digest", "parameters", "vocab",
                                                   "tokenizer_fingerprint", "chat_template_fingerprint")}))
    print(f"model directory: {out}")
    return 0


def _build_family(args: argparse.Namespace) -> int:
    if args.warmup_steps is not None or args.spec != "tiny":
        raise CliError("--family builds a random-weight model of the family: --spec/--warmup-steps do not apply")
    directory = args.dir if args.dir is not None else get_settings().model.families_dir / args.family
    out = build_family(directory, family_named(args.family), force=args.force, progress=print)
    manifest = read_manifest(out) or {}
    print(json.dumps({k: manifest.get(k) for k in ("family", "spec_digest", "parameters", "vocab", "vocab_sha256",
                                                   "tokenizer_fingerprint", "chat_template_fingerprint")}))
    print(f"model directory: {out}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    directory = _model_dir(args.dir)
    manifest = read_manifest(directory)
    if manifest is None:
        raise CliError(f"no model in {directory}; run `tokentrail model build`")
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0
