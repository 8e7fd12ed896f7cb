#!/bin/bash
# Reward 1 when the spinner no longer runs, spin.log stopped growing and pid.txt names it.
reward=/logs/verifier/reward.txt
cd /app || { echo 0 > "$reward"; exit 0; }
ok=1
if pgrep -f "$PWD/spinner.sh" > /dev/null; then echo "the spinner still runs"; ok=0; fi
before=$(wc -l < spin.log); sleep 0.6; after=$(wc -l < spin.log)
[ "$before" = "$after" ] || { echo "spin.log still grows"; ok=0; }
[ "$(tr -d '[:space:]' < pid.txt 2>/dev/null)" = "$(cat .spinner-pid)" ] || { echo "pid.txt is wrong"; ok=0; }
echo "$ok" > "$reward"
