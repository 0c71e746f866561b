#!/usr/bin/env bash
# The test suite as `make test` runs it: two pytest processes at once. The unit tests and the
# tests that start a Ray cluster of their own (tests/e2e/test_multinode.py) run beside the
# end-to-end tests that share one service (tests/e2e/conftest.py), whose waits leave a core
# free; that side's report follows the main one. Fails if either fails.
#
# Usage: scripts/test.sh PYTHON
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=$1
beside=(tests/unit tests/e2e/test_multinode.py)

log=$(mktemp)
"$python" -m pytest "${beside[@]}" --durations=10 >"$log" 2>&1 &
pid=$!
"$python" -m pytest tests/e2e --ignore=tests/e2e/test_multinode.py --durations=30
main=$?
wait "$pid"
side=$?
echo "== run beside it: ${beside[*]}"
cat "$log"
rm -f "$log"
exit $(( main != 0 || side != 0 ))
