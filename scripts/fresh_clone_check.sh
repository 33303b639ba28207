#!/usr/bin/env bash
# Issue 13's acceptance on a fresh clone: README's two commands in order, then the test
# command a second time; after each, the project's segments in /dev/shm and the live
# processes that carry a run identity (VERL_MP_RUN_ID). Run nothing else of the project on
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
for i in 1 2; do
  s=$(date +%s); .venv/bin/python -m pytest -q > "$work/test$i.log" 2>&1
  echo "tests run $i rc=$? $(( $(date +%s) - s )) s: $(tail -1 "$work/test$i.log")"
  leftovers "after-tests-$i"
done
