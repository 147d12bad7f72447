#!/usr/bin/env bash
# GPU CI for any CI system (GitLab, Buildkite, Jenkins, cron): what github-gpu.yml does, as one script.
#
#   examples/ci/run-gpu-ci.sh [--dry-run] [--artifacts DIR] [--update-baseline] [PROFILE ...] [-- PYTEST_ARGS ...]
#
# Run it from your project's root (where pyproject.toml has [tool.pytest_sglang.profiles.*]). For each PROFILE
# (a comma list such as baseline,eagle3 is one session: its sglang_compare tests run) it runs
#   pytest --sglang-profile=PROFILE --sglang-report=DIR/PROFILE/report.json --junitxml=DIR/PROFILE/junit.xml
#          --sglang-log-dir=DIR/PROFILE/logs [--sglang-baseline=FILE] PYTEST_ARGS
# keeping in DIR/PROFILE/: report.json, report.html, junit.xml, logs/ (the server logs), pytest.log and
# pytest-exit. Then gate.py (beside this script) reads every folder's report and junit file and decides:
#   exit 1   a regression (the report's gate.regressed), a failed test other than "its server could not
#            start", or pytest itself failing (interrupted, usage error, no tests ran);
#   exit 0   otherwise, with a WARNING: line for each infrastructure outcome (the report's gate.not_judged:
#            server failed to start, too noisy to judge, client-bound, no baseline yet).
# Infrastructure exits 0 by default because it says nothing about this commit's speed and a red job for a
# flaky GPU box trains people to ignore red jobs. Set SGLANG_CI_INFRA_EXIT=3 (any code but 1) to get a
# distinct code instead, for GitLab's `allow_failure: {exit_codes: [3]}` or Buildkite's
# `soft_fail: [{exit_status: 3}]`, which show the job amber rather than green.
#
# Options and environment:
#   --dry-run, SGLANG_CI_DRY_RUN=1   add --sglang-sim: the same profiles and tests on the bundled simulator
#   --artifacts DIR, SGLANG_CI_ARTIFACTS   artifact folder (default: ci-artifacts); upload it also on failure
#   --update-baseline                add --sglang-update-baseline: record; a copy lands in DIR/sglang-baselines.json
#   SGLANG_CI_PROFILES               profiles when none are given (space-separated; default: baseline)
#   SGLANG_CI_BASELINE               the committed baseline file (default: the plugin's, .sglang-baselines.json
#                                    in the rootdir)
#   SGLANG_CI_MAX_CV, SGLANG_CI_CONFIDENCE   this runner's noise: --sglang-max-cv / --sglang-confidence, the
#                                    gate's defaults for checks that set none (docs/gpu.md measures them)
#   SGLANG_CI_HISTORY                the run history file (--sglang-history): keep it across runs with your CI's
#                                    cache (GitLab `cache: paths:`, Buildkite's cache plugin) or on the runner
#   PYTHON                           the interpreter with pytest-sglang installed (default: python3)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
artifacts=${SGLANG_CI_ARTIFACTS:-ci-artifacts}
dry_run=${SGLANG_CI_DRY_RUN:-0}
update=0
profiles=()
pytest_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --update-baseline) update=1 ;;
    --artifacts) artifacts=${2:?--artifacts needs a folder}; shift ;;
    --artifacts=*) artifacts=${1#*=} ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    -*) echo "run-gpu-ci.sh: unknown option $1 (pytest options go after --)" >&2; exit 2 ;;
    *) profiles+=("$1") ;;
  esac
  shift
done
if [ ${#profiles[@]} -eq 0 ]; then
  read -r -a profiles <<< "${SGLANG_CI_PROFILES:-baseline}"
fi

extra=()
[ "$dry_run" = 1 ] && extra+=(--sglang-sim)
[ "$update" = 1 ] && extra+=(--sglang-update-baseline)
[ -n "${SGLANG_CI_BASELINE:-}" ] && extra+=("--sglang-baseline=$SGLANG_CI_BASELINE")
[ -n "${SGLANG_CI_MAX_CV:-}" ] && extra+=("--sglang-max-cv=$SGLANG_CI_MAX_CV")
[ -n "${SGLANG_CI_CONFIDENCE:-}" ] && extra+=("--sglang-confidence=$SGLANG_CI_CONFIDENCE")
[ -n "${SGLANG_CI_HISTORY:-}" ] && extra+=("--sglang-history=$SGLANG_CI_HISTORY")

mkdir -p "$artifacts"
dirs=()
for profile in "${profiles[@]}"; do
  name=${profile//[^A-Za-z0-9_.-]/+}  # baseline,eagle3 -> baseline+eagle3
  case $name in .|..) name=+$name ;; esac
  out=$artifacts/$name
  rm -rf "$out" && mkdir -p "$out/logs"
  echo "=== [gpu-ci] profile $profile -> $out${extra[*]:+ (${extra[*]})}"
  "$python" -m pytest "--sglang-profile=$profile" "--sglang-report=$out/report.json" \
    "--junitxml=$out/junit.xml" "--sglang-log-dir=$out/logs" "${extra[@]}" "${pytest_args[@]}" 2>&1 \
    | tee "$out/pytest.log"
  rc=${PIPESTATUS[0]}
  echo "$rc" > "$out/pytest-exit"
  echo "=== [gpu-ci] profile $profile: pytest exited $rc"
  dirs+=("$out")
done
if [ "$update" = 1 ] && [ -f "${SGLANG_CI_BASELINE:-.sglang-baselines.json}" ]; then
  cp "${SGLANG_CI_BASELINE:-.sglang-baselines.json}" "$artifacts/sglang-baselines.json"  # recorded: commit it
fi

# The verdict comes from the reports' gate fields and junit outcomes, never from grepping pytest's output.
"$python" "$here/gate.py" --format plain "${dirs[@]}"
