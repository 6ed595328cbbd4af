#!/usr/bin/env bash
# Serve a Hugging Face model directory with vLLM (CPU build, from .venv-vllm) on an OpenAI-compatible
# HTTP server, for the gateway's vLLM upstream (`tokentrail gateway --upstream http://HOST:PORT`).
# The process execs into the vLLM server, so stopping this script's process group stops vLLM.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: deploy/vllm/serve.sh --model DIR [--name NAME] [--port PORT] [--host HOST]
                            [--logprobs-mode raw_logprobs|processed_logprobs] [--quick-start]
                            [--no-weight-scatter]
                            [-- VLLM_ARGS...]

Starts vLLM's OpenAI-compatible server (python -m vllm.entrypoints.openai.api_server) from
.venv-vllm (install it with `make setup-vllm`). Ready when GET http://HOST:PORT/health answers 200.
On 2 cores a start takes 2-4 minutes (three processes each import vLLM; the first start also
torch.compiles the model, later ones reuse the compile cache), about 1-2 with --quick-start.

  --model DIR          model directory (config.json, tokenizer, safetensors); required
  --name NAME          served model name (default: tokentrail-tiny)
  --port PORT          listen port (default: 8000)
  --host HOST          listen address (default: 127.0.0.1)
  --logprobs-mode M    raw_logprobs (the model's distribution, vLLM's default) or
                       processed_logprobs (after temperature/top-k/top-p: the one sampled from)
  --quick-start        start in about a minute instead of two to four on 2 cores, for tests and
                       tiny models: no torch.compile warm-up (--enforce-eager), and the model worker
                       runs inside the engine-core process (one process spawn fewer, each costs
                       ~40 s of imports) without vLLM's OpenMP thread binding
  --no-weight-scatter  leave out tokentrail's worker extension (by default each worker gets the
                       methods of trainer_consumer/weight_sync/vllm_scatter.py, through which the
                       weight sync writes element deltas into the parameters in place; they run
                       only when called over /collective_rpc, which needs VLLM_SERVER_DEV_MODE=1)
  -- VLLM_ARGS...      passed to the vLLM server as they are (e.g. --enforce-eager)

Environment: VLLM_VENV (default <repo>/.venv-vllm), VLLM_CACHE_ROOT (compile cache, default
<repo>/var/vllm-cache), VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, default 1).
EOF
}

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MODEL="" NAME="tokentrail-tiny" PORT=8000 HOST=127.0.0.1 LOGPROBS_MODE=raw_logprobs QUICK=0 SCATTER=1
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --model) MODEL="${2:?--model needs a directory}"; shift 2 ;;
        --name) NAME="${2:?--name needs a value}"; shift 2 ;;
        --port) PORT="${2:?--port needs a value}"; shift 2 ;;
        --host) HOST="${2:?--host needs a value}"; shift 2 ;;
        --logprobs-mode) LOGPROBS_MODE="${2:?--logprobs-mode needs a value}"; shift 2 ;;
        --quick-start) QUICK=1; shift ;;
        --no-weight-scatter) SCATTER=0; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        *) echo "serve.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

[ -n "$MODEL" ] || { echo "serve.sh: --model DIR is required" >&2; usage >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "serve.sh: $MODEL has no config.json" >&2; exit 2; }
case "$LOGPROBS_MODE" in
    raw_logprobs|processed_logprobs) ;;
    *) echo "serve.sh: --logprobs-mode must be raw_logprobs or processed_logprobs (call records need" \
            "logprobs, not logits), not $LOGPROBS_MODE" >&2; exit 2 ;;
esac
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
[ -x "$VENV/bin/python" ] || { echo "serve.sh: no vLLM environment at $VENV; run 'make setup-vllm'" >&2; exit 2; }
unset VLLM_VENV  # vLLM warns about VLLM_* variables it does not know

# The KV cache is fixed (otherwise the CPU worker asks for 92% of the NUMA node's memory and refuses
# to start when anything else holds memory); no usage reports; never reach for the Hugging Face hub.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$ROOT/var/vllm-cache}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$VLLM_CACHE_ROOT"
if [ "$QUICK" = 1 ]; then
    # The CPU platform forces the multiprocess executor unless V1 multiprocessing is off; the API
    # server still runs the engine core in its own process either way.
    export VLLM_ENABLE_V1_MULTIPROCESSING=0
    EXTRA=(--enforce-eager --distributed-executor-backend uni "${EXTRA[@]}")
fi

if [ "$SCATTER" = 1 ]; then
    # The worker imports the extension from this repository (it needs only torch, numpy and safetensors,
    # which vLLM has); appended, so nothing of vLLM's environment is shadowed by a name of ours.
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT"
    EXTRA=(--worker-extension-cls trainer_consumer.weight_sync.vllm_scatter.ScatterExtension "${EXTRA[@]}")
fi

# `python -m`: the `vllm` console script looks up a distribution named "vllm", this one is "vllm-cpu".
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name "$NAME" \
    --dtype float32 --max-model-len 2048 \
    --host "$HOST" --port "$PORT" \
    --logprobs-mode "$LOGPROBS_MODE" \
    "${EXTRA[@]}"
