#!/bin/bash
# The issue-24 field check: the README's sweep five times with a second process spinning on
# one core, then once without it. Each table is saved with `uptime` before and after.
cd /tmp/trust-field-src
PY=/work/main/.venv/bin/python
OUT=/work/wt/trust/field
export PYTHONPATH=/tmp/trust-field-src
one() {  # $1: output file
  { echo "# commit $(cat $OUT/COMMIT); uptime before: $(uptime)"; \
    echo "# gputui sweep examples/tiny.toml --devices 1,2 --strategies scratch,ddp"; \
    $PY -m gputui sweep examples/tiny.toml --devices 1,2 --strategies scratch,ddp \
        --runs-dir /tmp/trust-field-runs-$(basename $1 .txt) 2>&1; \
    echo "# exit $?; uptime after: $(uptime)"; } > "$1"
}
for n in 1 2 3 4 5; do
  python3 -c 'while True: pass' &
  SPIN=$!
  one $OUT/spin-$n.txt
  kill $SPIN; wait $SPIN 2>/dev/null
done
one $OUT/idle.txt
echo done > $OUT/DONE
