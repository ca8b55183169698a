#!/usr/bin/env bash
# Reproduce the memory characterization (conf/study/characterization.yaml): the training sweeps, plan
# runs of the TB presets, then the report (figures + report.md).
#
#   scripts/study.sh [RESULTS_DIR]          # default results/runs/study-<time>
#
# Environment: MEMBENCH_VENV (default .venv), MEMBENCH_STUDY (default conf/study/characterization.yaml).
# About 10 minutes on 2 CPU cores. OOM points are part of the study (a sweep that ends `oom` is expected);
# any other failure is listed at the end and makes the exit status 1, after the report is written.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
venv="${MEMBENCH_VENV:-.venv}"
study="${MEMBENCH_STUDY:-conf/study/characterization.yaml}"
out="${1:-results/runs/study-$(date +%Y%m%d-%H%M%S)}"

if [[ ! -x "$venv/bin/python" ]]; then
  bash scripts/install.sh || exit 1
fi
py="$venv/bin/python"
if [[ -x "$venv/bin/membench" ]]; then membench=("$venv/bin/membench"); else membench=("$py" -m bench); fi
[[ -f "$study" ]] || { echo "study: $study not found" >&2; exit 2; }
mkdir -p "$out"
cp "$study" "$out/study.yaml"

# The study file -> one line per command: KIND <tab> NAME <tab> shell-quoted arguments
plan_lines="$("$py" - "$study" <<'EOF'
import shlex, sys
import yaml

study = yaml.safe_load(open(sys.argv[1]))
for sweep in study.get("sweeps") or []:
    print("sweep", sweep["name"], shlex.join(str(o) for o in sweep["overrides"]), sep="\t")
plan = study.get("plan") or {}
for entry in plan.get("runs") or []:
    for size in entry["world_sizes"]:
        args = [f"workload={entry['workload']}", f"hardware={entry.get('hardware', plan['hardware'])}",
                f"world_size={size}"]
        print("plan", f"{entry['workload']}@{size}", shlex.join(args), sep="\t")
print("report", "report", shlex.join(["--format", str((study.get("report") or {}).get("format", "png,svg"))]),
      sep="\t")
EOF
)" || { echo "study: cannot read $study" >&2; exit 2; }

started=$SECONDS
problems=()
timings=()
have_plan=""
if "${membench[@]}" plan --help >/dev/null 2>&1; then have_plan=1; fi

while IFS=$'\t' read -r kind name args; do
  eval "argv=($args)"
  t0=$SECONDS
  case "$kind" in
    sweep)
      echo "[study] sweep $name: ${membench[*]} run -m ${argv[*]} results_dir=$out/$name"
      "${membench[@]}" run -m "${argv[@]}" "results_dir=$out/$name" > "$out/$name.log" 2>&1
      rc=$?
      counts="$(grep -oE '^sweep-[^ ]+ +status [a-z]+' "$out/$name.log" | awk '{print $3}' | sort | uniq -c |
                awk '{printf "%s%s %s", sep, $1, $2; sep=", "}')"
      echo "[study] sweep $name: ${counts:-no points} (exit $rc, log $out/$name.log)"
      # 0: every point ok; 3: some point ran out of memory (expected on the frontier)
      if [[ $rc -ne 0 && $rc -ne 3 ]]; then problems+=("sweep $name exited $rc (see $out/$name.log)"); fi
      ;;
    plan)
      if [[ -z "$have_plan" ]]; then
        [[ -n "${plan_skipped:-}" ]] || echo "[study] plan mode is not available here (\`${membench[*]} plan --help\` failed): skipping the plan runs; figure 7 will be skipped"
        plan_skipped=1
        continue
      fi
      echo "[study] plan $name: ${membench[*]} plan ${argv[*]} results_dir=$out/plan"
      "${membench[@]}" plan "${argv[@]}" "results_dir=$out/plan" >> "$out/plan.log" 2>&1
      rc=$?
      grep -E "^[0-9]{8}-[0-9]{6}-[0-9a-f]+ +plan " "$out/plan.log" | tail -n 1 || true
      # 0: fits; 3: does not fit (a verdict, not an error)
      if [[ $rc -ne 0 && $rc -ne 3 ]]; then problems+=("plan $name exited $rc (see $out/plan.log)"); fi
      ;;
    report)
      if "${membench[@]}" report --help >/dev/null 2>&1; then report=("${membench[@]}" report); else report=("$py" -m bench.report); fi
      echo "[study] report: ${report[*]} $out --out $out/report ${argv[*]}"
      "${report[@]}" "$out" --out "$out/report" "${argv[@]}"
      rc=$?
      if [[ $rc -ne 0 ]]; then problems+=("report exited $rc"); fi
      ;;
  esac
  timings+=("$(printf '%-28s %5d s' "$kind $name" $((SECONDS - t0)))")
done <<< "$plan_lines"

echo "[study] time per step:"
printf '  %s\n' "${timings[@]}"
echo "[study] done in $((SECONDS - started)) s: $out/report/report.md"
if [[ ${#problems[@]} -gt 0 ]]; then
  printf '[study] problem: %s\n' "${problems[@]}" >&2
  exit 1
fi
