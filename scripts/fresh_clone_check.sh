#!/usr/bin/env bash
# Issue 13's acceptance on a fresh clone: README's two commands in order (the quick start,
# then the fast test set), then the rest of the suite (CI's order: every test once); after
# each, the project's segments in /dev/shm and the live processes that carry a run identity
# (VERL_MP_RUN_ID), and each test run's wall time. Run nothing else of the project on
# the machine meanwhile (its segments and processes would be counted).
# Usage: bash scripts/fresh_clone_check.sh [REPO (default: this checkout)] [WORKDIR (default: a temp dir)]
set -uo pipefail
repo=${1:-$(cd "$(dirname "$0")/.." && pwd)}
work=${2:-$(mktemp -d)}
leftovers() {
  echo "[$1] $(date +%T) shm: $(ls /dev/shm | grep -E 'cpushm|^psm_|^vmp|^sem\.mp-' | tr '\n' ' ')"
  local n=0
  for p in /proc/[0-9]*; do
    if grep -qa "VERL_MP_RUN_ID=" "$p/environ" 2>/dev/null; then
      n=$((n + 1)); echo "  live: $(tr '\0' ' ' < "$p/cmdline" | cut -c1-150)"
    fi
  done
  echo "[$1] processes carrying a run identity: $n"
}
git clone -q "$repo" "$work/clone" && cd "$work/clone" || exit 1
echo "commit $(git rev-parse --short HEAD); logs in $work"
leftovers before
s=$(date +%s); bash scripts/quickstart.sh > "$work/quickstart.log" 2>&1
echo "quickstart rc=$? $(( $(date +%s) - s )) s"
leftovers after-quickstart
run_tests() {  # name, pytest's -m expression
  local s; s=$(date +%s); .venv/bin/python -m pytest -q -m "$2" > "$work/$1.log" 2>&1
  echo "tests ($1: -m \"$2\") rc=$? $(( $(date +%s) - s )) s, load $(cut -d' ' -f1-3 /proc/loadavg): $(tail -1 "$work/$1.log")"
  leftovers "after-$1"
}
run_tests fast "unit or smoke"
run_tests rest "not unit and not smoke"
