#!/bin/bash
# Reward 1 when errors.txt holds exactly the per-service ERROR counts, in the asked order.
reward=/logs/verifier/reward.txt
cd /app || { echo 0 > "$reward"; exit 0; }
expected=$'db 3\napi 2\nworker 1'
if [ -f errors.txt ] && [ "$(sed 's/[[:space:]]*$//' errors.txt)" = "$expected" ]; then
    echo 1 > "$reward"
else
    echo "errors.txt: expected:"; echo "$expected"; echo "got:"; cat errors.txt 2>&1
    echo 0 > "$reward"
fi
