#!/usr/bin/env bash
# Run the whole suite N times on a clean clone of HEAD; print the failures of each run
# and a summary line. Exit status: 0 only if every run passed.
#
#   bench/flake.sh 5
#   VENV=/path/to/.venv WORKERS=2 bench/flake.sh 1
#
# The clone reuses an existing venv (VENV, default: this checkout's .venv) so torch is
# not reinstalled each time; the clone's own ddptop is imported because pytest runs from
# the clone's root (rootdir first on sys.path), which the first run checks.
set -u
N="${1:-1}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$HERE/.venv}"
WORKERS="${WORKERS:-2}"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "flake.sh: no python at $PY (set VENV)" >&2; exit 2; }
WORK="$(mktemp -d -t ddptop-flake-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
git clone -q --no-hardlinks "$HERE" "$WORK/repo" || exit 2
cd "$WORK/repo" || exit 2
echo "flake.sh: $N run(s) of the suite at $(git rev-parse --short HEAD) in $WORK/repo (venv $VENV, -n $WORKERS)"
imported="$(cd "$WORK/repo" && PYTHONPATH="$WORK/repo" "$PY" -c 'import ddptop; print(ddptop.__file__)')"
case "$imported" in
  "$WORK/repo/"*) ;;
  *) echo "flake.sh: the clone imports ddptop from $imported, not from the clone" >&2; exit 2 ;;
esac
failed_runs=0
total_failures=0
for i in $(seq 1 "$N"); do
  log="$WORK/run$i.log"
  start=$(date +%s)
  PYTHONPATH="$WORK/repo" "$PY" -m pytest -q -n "$WORKERS" -p no:cacheprovider >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  fails="$(grep -E '^(FAILED|ERROR) ' "$log" || true)"
  count=$(printf '%s' "$fails" | grep -c . || true)
  summary="$(tail -n 1 "$log")"
  echo "run $i: rc=$rc, ${secs}s, $count failure(s): $summary"
  [ -n "$fails" ] && printf '%s\n' "$fails" | sed 's/^/    /'
  if [ "$rc" -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    total_failures=$((total_failures + count))
    [ "$count" -eq 0 ] && tail -n 20 "$log" | sed 's/^/    /'
  fi
done
echo "flake.sh summary: $N run(s), $failed_runs failed, $total_failures failing test(s) in all"
[ "$failed_runs" -eq 0 ]
