#!/bin/bash
# Reward 1 when the shipped tests pass unchanged and the median is right on fresh inputs.
reward=/logs/verifier/reward.txt
cd /app || { echo 0 > "$reward"; exit 0; }
if grep -q 'assert median(\[4, 1, 3, 2\]) == 2.5' test_stats.py \
    && python3 test_stats.py \
    && python3 -c 'from stats import median; assert median([7, 1, 5, 3]) == 4; assert median([2, 9, 4, 7, 1, 8]) == 5.5; assert median([5]) == 5'; then
    echo 1 > "$reward"
else
    echo 0 > "$reward"
fi
