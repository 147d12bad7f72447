#!/usr/bin/env bash
# The plugin's whole flow on the lent H200: real SGLang 0.5.23 first, `transformers serve` as the second server.
# One stage per device call (from the repo root):
#   device run (carry .whl-sglang):  bash benchmarks/gpu_h200/run_h200.sh F     (or A, AB, AB2, B, C, CEIL, E, T, TEL)
# `vllm bench serve` beside the clients in the ceiling (client_ceiling, below): the host has no vllm, so pack its
# client here first, `python benchmarks/gpu_h200/pack_vllm_client.py --vllm-python VLLM_VENV/bin/python` (writes
# .whl-vllm, 0.6 MiB, pure Python: vllm's own benchmark files, stubs for what would start the engine), and carry
# .whl-vllm beside .whl-sglang/w; without it the ceiling has no vllm row.
# A: install the carried wheels; machine facts; make the model; session "record" (default profile,
#    --sglang-update-baseline, the gated benchmark plus NOISE_REPEATS repeats and the sweep); copy default's
#    baseline entries to the nograph profile; session "check" (default then nograph, no update: default's
#    unchanged rerun must pass, nograph = CUDA graphs off must fail "regressed"); the client ceiling.
#    (Seen: A's check session ran past its limit in nograph's gate, 7x slower; B redoes it with more time.)
# B: session "check" (default then nograph) on a fresh machine against the baseline A recorded (committed in
#    results/baselines.json, nograph carrying default's entries), the client ceiling, session "rerun" (default).
# C: benchmarks/calibrate.py --runs 4 on the gated test, each run its own pytest session and server.
# E: the seeds' comparison, one session: --sglang-profile=baseline,eagle3 (profiles-eagle3.toml, test_eagle3.py):
#    make_model.py makes the target and a random EAGLE-3 draft; $OUT/figures.jsonl gets each test's figures.
# T: the second server, `transformers serve` (profiles-tf.toml, test_tf_server.py, make_tf_model.py): a session
#    recording its baseline (tf-serve, tf-serve-cb), one checking against it, and the fault session
#    (tf-broken-config, tf-bad-flag: each must fail with the server's own root cause).
# F: the whole flow on one machine: E with baseline-nograph beside baseline and eagle3 (the greedy outputs of
#    each pair compared, with each divergence's logprob margins), then T's record and fault sessions.
# G: the CI script users copy (examples/ci/run-gpu-ci.sh) on real SGLang: record default's baseline
#    (--update-baseline), copy its entries to nograph, then check default and nograph: gate.py must pass
#    default and block on nograph's regression (exit 1).
# AB: interleaved A/B, real SGLang, the servers of each pair alive at once on the one GPU (profiles-ab.toml,
#    --mem-fraction-static 0.25 each; test_ab.py): ab-same vs ab-main (same flags) must pass, ab-mrr12
#    (--max-running-requests 12 at concurrency 16) vs ab-main must fail as regressed, plus study runs at other
#    round lengths; $OUT/figures.jsonl gets each A/B's rounds, ab_study.py turns them into $OUT/ab-study.json
#    (the paired spread by pairs and round length, the pairs a 5 % and a 10 % change need).
# TEL: issue 20's telemetry: baseline and eagle3 (profiles-eagle3.toml, --enable-metrics) through test_telemetry.py
#    in one session recording its baseline (energy per token beside tok/s), the GPU and /metrics series in
#    report-tel.json, plotted in report-tel.html, the sampler's own cost; then the client ceiling at concurrency
#    64, 256 and 1024, one event loop and 8 processes, beside sglang.bench_serving and vllm bench serve.
# AB2: does pinning each server to its own cores (profile key `cpus`) take away the per-server state behind
#    AB's false 0.79x between identical servers? profiles-ab2.toml's ab-main and ab-same on disjoint whole cores
#    (cpu_split: AB_MAIN_CPUS, AB_SAME_CPUS), pytest (the load generator) under taskset on the rest
#    (AB2_CLIENT_CPUS); test_ab.py's study at two round lengths, pinned and unpinned ("u": every thread of
#    both trees and pytest let onto all CPUs, then back) in alternation, last one pinned without the telemetry
#    sampler ("n": its cost, paired in time with the pinned ones) (AB2_STUDY); ab_study.py sets them beside
#    call 1's unpinned rounds (results/ab1) in $OUT/ab-study.json; then, in the time left, the client ceiling
#    at 256 and 1024 with 10 simulators and 4 and 8 client processes ($OUT/ceiling.json). Budget: setup ~55 s,
#    the pytest session <= AB2_LIMIT (400 s: two startups ~165 s, the rounds ~180 s at call 1's 0.66 s per
#    16-request and 1.75 s per 64-request round, teardown ~20 s), the ceiling what is left of 500 s, then
#    summarize and the bundle: one device call of 540 s.
# CEIL: issue 20 point 5, the client ceiling alone (benchmarks/client_ceiling.py, ~300 s with setup): every level
#    paced at one total (CEIL_TOTAL, 51200 tok/s: c=64 at 800 tok/s a stream, 256 at 200, 1024 at 50), short
#    (200-token) then long (1024) rows, our client at 1 and 8 processes beside sglang.bench_serving and, where
#    .whl-vllm was carried, `vllm bench serve`; simulators `auto` (6 of 16 cores). Each row
#    is written to $OUT/ceiling.json as it finishes, so the limit (CEIL_LIMIT) cuts only the rows not yet run
#    (the last, c=1024 long, needs ~3 min alone: CEIL_LEVELS=1024 CEIL_LENS=1024 runs it in a call of its own).
#    vllm's row needs the carried .whl-vllm (client_ceiling, above).
# GB: issue 24's GPU-bound regime: make_big_model.py's random 3.0B Llama, two servers alive on the GPU
#    (profiles-gpu.toml: --disable-radix-cache, --disable-prefill-cuda-graph), prefill-heavy rounds (32 requests
#    of 2048 tokens in, 64 out, concurrency 32; test_gpu_bound.py): a session of GB_AA_JOBS A/A jobs recorded
#    with --sglang-update-baseline, then, on the same two servers (--sglang-reuse), a session of slowdown jobs:
#    the twin's forward passes made GB_SIZES per cent longer on the GPU (pypath/sglprobe_slowdown.py) and judged
#    with the README's default check against the recorded A/A runs; GB_END (s after the start) ends the last
#    session, GB_SLOW_S of it left to the slowdowns; $OUT/figures.jsonl gets every job's rounds.
# AB3: issue 24's recipe on the 160M model: 5 A/A jobs recorded (--sglang-update-baseline), then candidates
#    --max-running-requests 8 and 12 at concurrency 16, each with the README's default check (test_ab_recipe.py,
#    profiles-ab.toml); one session, 4 server startups; AB3_END (s after the start) ends it.
# Everything goes to $OUT: terminal.txt, results.json, the reports, baselines.json, bundle.tar.gz (logs, HTML).
set -u
STAGE=${1:-A}
OUT=${OUT:-/tmp/gpu-sglang-out}
W=${GPU_WORK:-/tmp/gpu-sglang}
PY=${PY:-python3}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export GPU_WORK=$W PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RELEASE_LOG=$W/out/release.jsonl
export SGLPROBE_NO_JIT=1 SGLANG_FORCE_FUSED_OP_BACKEND=torch SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \
  SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1
unset SGLANG_USE_CPU_ENGINE
mkdir -p "$OUT" "$W/out"
cd "$repo" || exit 1
T0=$SECONDS
stamp() { echo "=== $* ($(( SECONDS - T0 )) s)"; }

setup() {
  stamp "install wheels"
  if [ -f /tmp/site/sglang/__init__.py ]; then echo "already installed (a warm machine)"
  else "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl-sglang/w/*.whl || { echo "wheel install failed"; return 1; }; fi
  export PYTHONPATH=$here/pypath:/tmp/site:$repo
  stamp "machine"
  nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  uname -r; nproc; free -g | head -2
  "$PY" - "$W/out/machine.json" <<'PYEOF'
import importlib.metadata as m, json, os, subprocess, sys
import torch
info = {"python": sys.version.split()[0], "cores": os.cpu_count(), "kernel": os.uname().release,
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(0), "sm": torch.cuda.get_device_properties(0).multi_processor_count,
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        "nvidia_smi": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                      "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()}
for n in ("sglang", "triton", "transformers", "tokenizers", "pytest", "nvidia-ml-py", "psutil", "requests",
          "fastapi", "uvicorn", "xgrammar"):
    try:
        info[n] = m.version(n)
    except m.PackageNotFoundError:
        info[n] = None
print(json.dumps(info, indent=1))
open(sys.argv[1], "w").write(json.dumps(info, indent=1))
PYEOF
  [ "${SMALL_MODEL:-1}" = 0 ] && return 0  # GB makes its own model
  stamp "make model"
  { [ -f "$W/llama-random/config.json" ] && { [ -z "${DRAFT:-}" ] || [ -f "$DRAFT/config.json" ]; }; } ||
    "$PY" benchmarks/gpu_h200/make_model.py "$W/llama-random" ${DRAFT:+"$DRAFT"} 2>&1 | tail -3
  "$PY" -c "import json;c=json.load(open('$W/llama-random/config.json'));print({k:c.get(k) for k in ('architectures','hidden_size','intermediate_size','num_hidden_layers','num_attention_heads','num_key_value_heads','head_dim','vocab_size','torch_dtype','dtype')})"
  du -sh "$W/llama-random"
}

session() {  # session NAME TIMEOUT pytest-args...: the SGLang tests (test_gpu_sglang.py, profiles.toml)
  local name=$1 limit=$2; shift 2
  run_pytest "$name" "$limit" test_gpu_sglang.py profiles.toml "$@"
}

run_pytest() {  # run_pytest NAME TIMEOUT TEST_FILE PROFILES_FILE pytest-args...
  local name=$1 limit=$2 file=benchmarks/gpu_h200/$3 config=benchmarks/gpu_h200/$4; shift 4
  stamp "pytest session $name"
  echo "+ ${PYTEST_WRAP:+$PYTEST_WRAP }pytest $file -p pytest_sglang.plugin --sglang-config=$config --sglang-report=$W/out/report-$name.json --sglang-log-dir=$W/out/logs-$name -rA -v -p no:cacheprovider $*"
  # shellcheck disable=SC2086  # PYTEST_WRAP is a command prefix, split into words on purpose
  timeout -k 10 "$limit" ${PYTEST_WRAP:-} "$PY" -m pytest "$file" -p pytest_sglang.plugin --sglang-config="$config" \
    --sglang-report="$W/out/report-$name.json" --sglang-log-dir="$W/out/logs-$name" -rA -v -p no:cacheprovider "$@"
  echo "pytest session $name exit $?"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  pgrep -af "sglang|transformers serve" | grep -v pgrep || echo "no server process left"
}

client_ceiling() {  # client_ceiling LIMIT ARGS...: benchmarks/client_ceiling.py, with the carried slim vllm client
  local limit=$1 path=${PYTHONPATH:-} vllm=(); shift
  if [ -f "$repo/.whl-vllm/vllm/benchmarks/serve.py" ]; then
    # the slim tree on this command's path alone: SGLang's server imports vllm.logger where it finds a vllm
    path=${path:+$path:}$repo/.whl-vllm vllm=(--vllm-python "$PY")
    PYTHONPATH=$path "$PY" -c "import vllm; print('vllm bench serve: the slim client of vllm', vllm.__version__)"
  else echo "no .whl-vllm carried: the ceiling has no vllm bench serve row"; fi
  PYTHONPATH=$path timeout -k 5 "$limit" "$PY" benchmarks/client_ceiling.py ${vllm[0]:+"${vllm[@]}"} "$@"
  echo "client ceiling exit $?"
}

nograph_checks_against_default() {  # FILE: the regression is judged against default's baseline entries
  "$PY" - "$1" <<'PYEOF'
import copy, json, sys
d = json.load(open(sys.argv[1]))
d["baselines"]["nograph"] = copy.deepcopy(d["baselines"]["default"])
json.dump(d, open(sys.argv[1], "w"), indent=1)
print("copied default's baseline entries to nograph:", sorted(d["baselines"]["default"]))
PYEOF
}

stage_a() {
  setup || return 1
  GATE_ROUNDS=5 NOISE_REPEATS=${NOISE_REPEATS:-5} session record 220 --sglang-profile=default \
    --sglang-update-baseline --sglang-baseline="$W/out/baselines.json"
  cp "$W/out/baselines.json" "$W/out/baselines-recorded.json"
  nograph_checks_against_default "$W/out/baselines.json"
  GATE_ROUNDS=5 SWEEP=1 session check 255 --sglang-profile=default,nograph --sglang-baseline="$W/out/baselines.json"
  stamp "client ceiling"
  timeout -k 5 45 "$PY" benchmarks/client_ceiling.py --levels 16,64,128,256 --decode-tok-s 200 --output-len 200 \
    --waves 2 --json-out "$W/out/ceiling.json"
}

stage_b() {
  setup || return 1
  cp benchmarks/gpu_h200/results/baselines.json "$W/out/baselines.json"
  GATE_ROUNDS=5 SWEEP=1 session check 330 --sglang-profile=default,nograph --sglang-baseline="$W/out/baselines.json"
  stamp "client ceiling, with the client's own busy share"
  timeout -k 5 50 "$PY" - "$W/out/ceiling.json" <<'PYEOF'
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
from client_ceiling import start_sim
from pytest_sglang.bench import expected_throughput, run_bench
import os, signal
knobs = {"startup_seconds": 0.2, "decode_tok_s": 200.0, "ttft_ms": 20.0, "max_batch": 256}
rows = []
with tempfile.TemporaryDirectory() as tmp:
    proc, url = start_sim(knobs, Path(tmp) / "sim.log")
    try:
        for c in (16, 32, 48, 64, 96, 128):
            paced = expected_throughput(num_requests=2 * c, concurrency=c, output_len=200, ttft_s=0.02, decode_tok_s=200.0)
            r = run_bench(url, num_requests=2 * c, concurrency=c, input_len=32, output_len=200, warmup=1, allow_failures=True)
            rows.append({"concurrency": c, "paced_tok_s": paced, "ours_tok_s": r.output_throughput,
                         "ours_ratio": r.output_throughput / paced, "client_busy": r.client_busy,
                         "client_bound": r.client_bound, "failed": r.failed, "median_ttft_ms": r.median_ttft_ms})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
ok = [x["paced_tok_s"] for x in rows if x["ours_ratio"] >= 0.97]
json.dump({"ours_ceiling_tok_s": max(ok) if ok else 0.0, "tolerance": 0.03, "knobs": knobs, "output_len": 200,
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
PYEOF
  cp benchmarks/gpu_h200/results/call1/report-record.json "$W/out/" 2>/dev/null  # the across-session calibration
  local rem=$(( 575 - (SECONDS - T0) ))
  if [ "$rem" -gt 135 ]; then
    GATE_ROUNDS=5 SWEEP=0 session rerun "$rem" --sglang-profile=default --sglang-baseline="$W/out/baselines.json"
  else echo "no time left for the rerun session ($rem s)"; fi
}

stage_c() {  # C: benchmarks/calibrate.py itself, RUNS fresh pytest sessions (each its own server) on one machine
  setup || return 1
  stamp "calibrate.py --runs ${RUNS:-4}"
  echo "+ python benchmarks/calibrate.py --runs ${RUNS:-4} --write $W/out/calibrate.md -- benchmarks/gpu_h200/test_gpu_sglang.py -k 'warm or gate' -p pytest_sglang.plugin --sglang-config=benchmarks/gpu_h200/profiles.toml --sglang-profile=default"
  uptime
  GATE_ROUNDS=5 timeout -k 10 "${CAL_LIMIT:-470}" "$PY" benchmarks/calibrate.py --runs "${RUNS:-4}" --write "$W/out/calibrate.md" \
    -- benchmarks/gpu_h200/test_gpu_sglang.py -k "warm or gate" -p pytest_sglang.plugin \
    --sglang-config=benchmarks/gpu_h200/profiles.toml --sglang-profile=default
  echo "calibrate exit $?"; uptime
  local i=0
  for f in /tmp/sglang-calibrate-*/run-*.json; do [ -f "$f" ] || continue
    cp "$f" "$W/out/report-cal$(basename "$f" .json | tr -d -c 0-9).json"; i=$((i+1)); done
  echo "$i calibration reports kept"
}

stage_e() {  # E: baseline then eagle3 in one pytest session, then the sglang_compare tests
  export DRAFT=$W/eagle3-random
  setup || return 1
  FIGURES=$OUT/figures.jsonl run_pytest eagle3 "${E_LIMIT:-215}" test_eagle3.py profiles-eagle3.toml \
    --sglang-profile="${E_PROFILES:-baseline,eagle3}"
}

tf_model() {
  stamp "make the transformers-serve model"
  "$PY" benchmarks/gpu_h200/make_tf_model.py "$W/tf" 2>&1 | grep -v "^\s*$" | grep -v "Writing model shards" || true
  mkdir -p "$W/tf/hf-cache"  # an existing, empty hub cache keeps GET /v1/models from answering 500 offline
  [ -f "$W/tf/llama-random/config.json" ]
}

stage_t() {  # T: transformers serve, the second server: record, check, faults
  [ -n "${SKIP_SETUP:-}" ] || setup || return 1
  tf_model || { echo "no transformers-serve model made"; return 1; }
  local base=(--sglang-baseline="$W/out/baselines-tf.json")
  run_pytest tf-record "${T_LIMIT:-150}" test_tf_server.py profiles-tf.toml "${base[@]}" \
    --sglang-profile="${T_PROFILES:-tf-serve,tf-serve-cb}" --sglang-update-baseline
  [ -n "${T_CHECK-1}" ] && run_pytest tf-check "${T_LIMIT:-150}" test_tf_server.py profiles-tf.toml "${base[@]}" \
    --sglang-profile="${T_PROFILES:-tf-serve,tf-serve-cb}"
  run_pytest tf-fault 100 test_tf_fault.py profiles-tf.toml --sglang-profile=tf-broken-config,tf-bad-flag
}

stage_f() {  # F: the seeds' comparison with baseline-nograph beside it, then the second server
  E_PROFILES=baseline,eagle3,baseline-nograph E_LIMIT=${E_LIMIT:-330} stage_e
  local rem=$(( 570 - (SECONDS - T0) ))
  if [ "$rem" -gt 120 ]; then
    SKIP_SETUP=1 T_PROFILES=tf-serve T_CHECK="" T_LIMIT=$(( rem - 110 > 150 ? 150 : rem - 110 )) stage_t
  else echo "no time left for the transformers-serve sessions ($rem s)"; fi
}

stage_g() {  # G: examples/ci/run-gpu-ci.sh, record then check, on the gated tests
  setup || return 1
  local ci=(-- benchmarks/gpu_h200/test_gpu_sglang.py -p pytest_sglang.plugin
            --sglang-config=benchmarks/gpu_h200/profiles.toml -k "completion or startup or warm or gate" -rA)
  export SGLANG_CI_BASELINE=$W/out/ci-baselines.json GATE_ROUNDS=${GATE_ROUNDS:-3} SWEEP=0 NOISE_REPEATS=0
  stamp "run-gpu-ci.sh --update-baseline default"
  echo "+ PYTHON=$PY examples/ci/run-gpu-ci.sh --update-baseline --artifacts $W/out/ci-record default ${ci[*]}"
  PYTHON=$PY timeout -k 10 170 bash examples/ci/run-gpu-ci.sh --update-baseline --artifacts "$W/out/ci-record" \
    default "${ci[@]}"
  echo "run-gpu-ci.sh (record) exit $?"
  nograph_checks_against_default "$SGLANG_CI_BASELINE"
  stamp "run-gpu-ci.sh default nograph"
  echo "+ PYTHON=$PY examples/ci/run-gpu-ci.sh --artifacts $W/out/ci-check default nograph ${ci[*]}"
  PYTHON=$PY timeout -k 10 330 bash examples/ci/run-gpu-ci.sh --artifacts "$W/out/ci-check" default nograph "${ci[@]}"
  echo "run-gpu-ci.sh (check) exit $?"
  for d in "$W"/out/ci-record/* "$W"/out/ci-check/*; do
    [ -f "$d/report.json" ] && cp "$d/report.json" "$W/out/report-$(basename "$(dirname "$d")")-$(basename "$d").json"
  done
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv; pgrep -af "sglang.launch_server" || echo "no server left"
}

stage_ab() {  # AB: interleaved A/B on one GPU, then the spread study
  setup || return 1
  FIGURES=$OUT/figures.jsonl run_pytest ab "${AB_LIMIT:-420}" test_ab.py profiles-ab.toml \
    --sglang-profile=ab-main,ab-same,ab-mrr12
  stamp "ab_study.py"
  "$PY" benchmarks/gpu_h200/ab_study.py "$OUT/figures.jsonl" "$OUT/ab-study.json"
}

cpu_split() {  # "MAIN SAME CLIENT": whole cores (hyperthread siblings together) in two equal halves and the rest
  "$PY" - <<'PYEOF'
import os
from pathlib import Path


def core(cpu: int) -> tuple[str, str]:
    topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return (topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()
    except OSError:
        return "0", str(cpu)


cores: dict[tuple[str, str], list[int]] = {}
for cpu in sorted(os.sched_getaffinity(0)):
    cores.setdefault(core(cpu), []).append(cpu)
whole = list(cores.values())
client_cores = 1 if len(whole[0]) > 1 else 2  # the load generator: one core's threads, or two CPUs
servers, client = whole[:-client_cores], whole[-client_cores:]
half = len(servers) // 2


def cpus(group: list[list[int]]) -> str:
    return ",".join(str(c) for g in group for c in g)


print(cpus(servers[:half]), cpus(servers[half:2 * half]), cpus(client))
PYEOF
}

stage_ab2() {  # AB2: the A-vs-A study pinned (profile key cpus) and unpinned, beside call 1; the ceiling after
  setup || return 1
  stamp "cpu topology"
  lscpu -e=CPU,CORE,SOCKET,NODE 2>/dev/null | head -40 || echo "no lscpu"
  local main same client
  read -r main same client < <(cpu_split)
  export AB_MAIN_CPUS=${AB_MAIN_CPUS:-$main} AB_SAME_CPUS=${AB_SAME_CPUS:-$same}
  client=${AB2_CLIENT_CPUS:-$client}
  echo "ab-main on $AB_MAIN_CPUS, ab-same on $AB_SAME_CPUS, pytest on $client"
  local wrap=""
  if command -v taskset >/dev/null; then wrap="taskset -c $client"; else echo "no taskset: pytest unpinned"; fi
  AB_STUDY=${AB2_STUDY:-"16x20 u16x20 64x10 u64x10 16x20 n16x20"} FIGURES=$OUT/figures.jsonl PYTEST_WRAP=$wrap \
    run_pytest ab2 "${AB2_LIMIT:-400}" test_ab.py profiles-ab2.toml --sglang-profile=ab-main,ab-same -k study
  stamp "ab_study.py"
  "$PY" benchmarks/gpu_h200/ab_study.py call-ab1=benchmarks/gpu_h200/results/ab1/figures.jsonl \
    "call-ab2=$OUT/figures.jsonl" "$OUT/ab-study.json"
  local rem=$(( ${AB2_END:-500} - (SECONDS - T0) ))
  if [ "$rem" -lt 45 ]; then echo "no time left for the client ceiling ($rem s)"; return 0; fi
  stamp "client ceiling: 4 and 8 processes, ${CEIL_SIMS:-10} simulators on one port, limit $rem s"
  timeout -k 5 "$rem" "$PY" benchmarks/client_ceiling.py --levels 256,1024 --decode-tok-s 200 --output-len 200 \
    --waves 2 --client-processes 4,8 --sim-processes "${CEIL_SIMS:-10}" --json-out "$OUT/ceiling.json"
  echo "client ceiling exit $?"
}

stage_tel() {  # TEL: telemetry of baseline and eagle3, recorded as a baseline; the ceiling past 50k tok/s
  export DRAFT=$W/eagle3-random
  setup || return 1
  FIGURES=$OUT/figures.jsonl run_pytest tel "${TEL_LIMIT:-270}" test_telemetry.py profiles-eagle3.toml \
    --sglang-profile=baseline,eagle3 --sglang-update-baseline --sglang-baseline="$W/out/baselines-tel.json"
  stamp "client ceiling: 1 and 8 processes beside sglang.bench_serving and vllm, 6 simulators on one port"
  client_ceiling "${CEIL_LIMIT:-150}" --levels 64,256,1024 --decode-tok-s 200 \
    --output-len 200 --waves 2 --client-processes 1,8 --sim-processes 6 --sglang-python "$PY" \
    --tokenizer "$W/llama-random" --json-out "$W/out/ceiling.json"
}

stage_ceil() {  # CEIL: the client ceiling at one total pace, short and long rows, beside the peers
  setup || return 1
  stamp "client ceiling: total ${CEIL_TOTAL:-51200} tok/s, levels ${CEIL_LEVELS:-64,256,1024}, output ${CEIL_LENS:-200,1024}, limit ${CEIL_LIMIT:-235} s"
  client_ceiling "${CEIL_LIMIT:-235}" --levels "${CEIL_LEVELS:-64,256,1024}" \
    --total-tok-s "${CEIL_TOTAL:-51200}" --output-len "${CEIL_LENS:-200,1024}" --waves "${CEIL_WAVES:-2}" \
    --repeats "${CEIL_REPEATS:-1}" --client-processes 1,8 --sim-processes auto --sglang-python "$PY" \
    --tokenizer "$W/llama-random" --json-out "$W/out/ceiling.json"
  cp "$W/out/ceiling.json" "$OUT/ceiling.json" 2>/dev/null || echo "no ceiling.json written"
  pgrep -af "pytest_sglang.sim" | grep -v pgrep || echo "no simulator left"
}

stage_gb() {  # GB: the GPU-bound regime (3B model, prefill-heavy, uncached): A/A noise, controlled slowdowns
  SMALL_MODEL=0 setup || return 1
  stamp "make the 3B model"
  [ -f "$W/llama-3b/config.json" ] || "$PY" benchmarks/gpu_h200/make_big_model.py "$W/llama-3b" 2>&1 | tail -2
  du -sh "$W/llama-3b"
  rm -rf "$W/slowdown" "$W/out/baselines-gb.json"
  mkdir -p "$W/slowdown"
  local end=$(( $(date +%s) - (SECONDS - T0) + ${GB_END:-535} ))  # the last session's end, in epoch seconds
  local gb=(--sglang-profile="${GB_PAIR:-g-main,g-twin}" --sglang-baseline="$W/out/baselines-gb.json" --sglang-reuse)
  export FIGURES=$OUT/figures.jsonl
  # the A/A jobs leave the slowdown session ${GB_SLOW_S:-75} s; each session's own limit is what is left
  GB_DEADLINE=$(( end - ${GB_SLOW_S:-75} )) run_pytest gb-aa $(( end - ${GB_SLOW_S:-75} + 60 - $(date +%s) )) \
    test_gpu_bound.py profiles-gpu.toml "${gb[@]}" -k test_aa --sglang-update-baseline
  cp "$W/out/baselines-gb.json" "$W/out/baselines-gb-aa.json" 2>/dev/null
  GB_DEADLINE=$end run_pytest gb-slow $(( end + 20 - $(date +%s) )) test_gpu_bound.py profiles-gpu.toml "${gb[@]}" \
    -k test_slowdown
  stamp "stop the kept servers"
  timeout -k 5 60 "$PY" -m pytest benchmarks/gpu_h200/test_gpu_bound.py -p pytest_sglang.plugin \
    --sglang-config=benchmarks/gpu_h200/profiles-gpu.toml --sglang-stop -p no:cacheprovider
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  cp "$W/out/baselines-gb.json" "$OUT/" 2>/dev/null
}

stage_ab3() {  # AB3: issue 24's recipe on the 160M model under the one gate rule (test_ab_recipe.py)
  setup || return 1
  rm -f "$W/out/baselines-ab3.json"
  FIGURES=$OUT/figures.jsonl run_pytest ab3 $(( ${AB3_END:-575} - (SECONDS - T0) )) test_ab_recipe.py profiles-ab.toml \
    --sglang-profile=ab-main,ab-same,ab-mrr8,ab-mrr12 --sglang-update-baseline \
    --sglang-baseline="$W/out/baselines-ab3.json"
  cp "$W/out/baselines-ab3.json" "$OUT/" 2>/dev/null
}

{ case "$STAGE" in A) stage_a ;; B) stage_b ;; C) stage_c ;; E) stage_e ;; T) stage_t ;; F) stage_f ;;
    G) stage_g ;; AB) stage_ab ;; AB2) stage_ab2 ;; TEL) stage_tel ;; CEIL) stage_ceil ;; GB) stage_gb ;;
    AB3) stage_ab3 ;; *) echo "unknown stage $STAGE: A, AB, AB2, AB3, B, C, CEIL, E, F, G, GB, T or TEL" ;; esac
  stamp "summarize"
  "$PY" benchmarks/gpu_h200/summarize.py "$W/out" "$W/out/results.json"
  stamp "done"; } 2>&1 | tee "$OUT/terminal.txt"
for f in results.json report-record.json report-check.json report-rerun.json report-eagle3.json \
  report-tf-record.json report-tf-fault.json report-ci-check-nograph.json report-tel.json report-tel.html report-ab.json \
  report-ab2.json report-gb-slow.json report-ab3.json; do  # machine.json, release.jsonl: in the bundle (8 files come back)
  cp "$W/out/$f" "$OUT/" 2>/dev/null; done
cp "$W/out/report-check.html" "$W/out/calibrate.md" "$OUT/" 2>/dev/null
# logs trimmed: the first 400 and last 200 lines of each server log
for d in "$W"/out/logs-*; do [ -d "$d" ] || continue
  for l in "$d"/*.log; do [ -f "$l" ] || continue
    { head -400 "$l"; echo "... [trimmed] ..."; tail -200 "$l"; } > "$l.trim" 2>/dev/null; done; done
tar -czf "$OUT/bundle.tar.gz" -C "$W/out" --exclude='*.log' . 2>/dev/null
ls -la "$OUT"
