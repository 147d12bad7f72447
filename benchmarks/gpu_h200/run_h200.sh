#!/usr/bin/env bash
# The whole GPU flow in one device call, from the repository root:
#   device run (carry .whl):  bash benchmarks/gpu_h200/run_h200.sh
# 1. install the carried serving wheels (fastapi, uvicorn, pydantic, openai...) into /tmp/site;
# 2. make the random-weight Llama model (make_model.py) and its broken-config twin;
# 3. pytest run 1 with --sglang-update-baseline, run 2 comparing against it (same machine fingerprint);
# 4. a fault run: the broken-config and bad-flag profiles must fail fast with the server's root cause.
# Terminal output goes to $OUT/terminal.txt; reports, baselines and server logs to $OUT (few files: the device
# tool brings back at most 8) and the rest in $OUT/bundle.tar.gz.
# Local CPU rehearsal: H200_SMALL=1 H200_DEVICE=cpu WHEELS=none PY=/path/python bash run_h200.sh
set -u
OUT=${OUT:-/tmp/h200-out}
W=${H200_WORK:-/tmp/h200}
PY=${PY:-python3}
export H200_WORK=$W PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p "$OUT" "$W/hf-cache" "$W/out"
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo" || exit 1

main() {
  local t0=$SECONDS
  if [ "${WHEELS:-carry}" = carry ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "wheel install failed"; return 1; }
    export PYTHONPATH=/tmp/site:$repo
  else
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$repo
  fi
  echo "=== machine"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 || echo "(no nvidia-smi)"
  uname -r; nproc
  "$PY" - <<'EOF'
import importlib.metadata as m, sys
print("python", sys.version.split()[0], sys.executable)
for n in ("torch", "transformers", "tokenizers", "accelerate", "fastapi", "starlette", "uvicorn", "pydantic",
          "openai", "pytest", "pytest-timeout", "requests", "psutil", "filelock"):
    try:
        print(f"  {n} {m.version(n)}")
    except m.PackageNotFoundError:
        print(f"  {n} MISSING")
try:
    import torch
    print("  cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
except Exception as e:
    print("  torch:", e)
EOF

  echo "=== make model ($(( SECONDS - t0 )) s)"
  local small=""
  [ -n "${H200_SMALL:-}" ] && small="--small --device cpu"
  # shellcheck disable=SC2086
  "$PY" benchmarks/gpu_h200/make_model.py "$W" $small 2>&1 \
    | grep -v "^\s*$" | grep -v "Writing model shards" || true
  [ -f "$W/llama-random/config.json" ] || { echo "no model made"; return 1; }
  du -sh "$W/llama-random"

  local load=()  # the plugin registers through its pytest11 entry point once installed; else load it by name
  "$PY" -c "import importlib.metadata as m, sys; sys.exit(any(e.value == 'pytest_sglang.plugin' for e in m.entry_points(group='pytest11')))" \
    && load=(-p pytest_sglang.plugin)
  local common=("${load[@]}" --sglang-config=benchmarks/gpu_h200/profiles.toml
                --sglang-baseline="$W/out/baselines.json" -rA -v -p no:cacheprovider)
  echo "=== pytest run 1: record the baseline ($(( SECONDS - t0 )) s)"
  echo "+ pytest benchmarks/gpu_h200/test_gpu_server.py --sglang-profile=tf-serve,tf-serve-cb --sglang-update-baseline --sglang-report=$W/out/report1.json"
  timeout -k 10 "${RUN_TIMEOUT:-210}" "$PY" -m pytest benchmarks/gpu_h200/test_gpu_server.py "${common[@]}" \
    --sglang-profile=tf-serve,tf-serve-cb --sglang-update-baseline \
    --sglang-report="$W/out/report1.json" --sglang-log-dir="$W/out/logs1"
  echo "pytest run 1 exit $?"
  cp "$W/out/baselines.json" "$W/out/baselines-after-run1.json" 2>/dev/null

  echo "=== pytest run 2: compare against the baseline ($(( SECONDS - t0 )) s)"
  echo "+ pytest benchmarks/gpu_h200/test_gpu_server.py --sglang-profile=tf-serve,tf-serve-cb --sglang-report=$W/out/report.json"
  timeout -k 10 "${RUN_TIMEOUT:-210}" "$PY" -m pytest benchmarks/gpu_h200/test_gpu_server.py "${common[@]}" \
    --sglang-profile=tf-serve,tf-serve-cb \
    --sglang-report="$W/out/report.json" --sglang-log-dir="$W/out/logs2"
  echo "pytest run 2 exit $?"

  echo "=== pytest fault run ($(( SECONDS - t0 )) s)"
  echo "+ pytest benchmarks/gpu_h200/test_gpu_fault.py --sglang-profile=tf-broken-config,tf-bad-flag"
  timeout -k 10 120 "$PY" -m pytest benchmarks/gpu_h200/test_gpu_fault.py "${common[@]}" \
    --sglang-profile=tf-broken-config,tf-bad-flag --sglang-log-dir="$W/out/logs-fault"
  echo "pytest fault run exit $?"
  echo "=== done ($(( SECONDS - t0 )) s)"
  echo "leftover server processes:"; pgrep -af "transformers.cli.transformers serve" || echo "  none"
}

main 2>&1 | tee "$OUT/terminal.txt"
cp "$W/out/report1.json" "$W/out/report.json" "$W/out/baselines.json" "$OUT/" 2>/dev/null
cp "$W/out/logs2/tf-serve-cb.log" "$OUT/tf-serve-cb.log" 2>/dev/null
cp "$W/out/logs-fault/tf-broken-config.log" "$OUT/tf-broken-config.log" 2>/dev/null
tar -czf "$OUT/bundle.tar.gz" -C "$W/out" . 2>/dev/null
ls -la "$OUT"
