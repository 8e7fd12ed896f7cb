#!/bin/bash
# Reward 1 when the shipped tests pass unchanged and both fixes hold on fresh inputs.
reward=/logs/verifier/reward.txt
cd /app || { echo 0 > "$reward"; exit 0; }
if grep -q 'assert with_tax(1005, "food") == 1106' test_cart.py \
    && python3 test_cart.py \
    && python3 -c '
from cart import total
from prices import with_tax
assert with_tax(999, "other") == 1249   # 1248.75
assert with_tax(2, "other") == 3         # 2.5 rounds up
assert with_tax(1, "food") == 1          # 1.1
assert total([]) == 0
assert total([(999, "other", 3), (5, "books", 7)]) == 3 * 1249 + 35
'; then
    echo 1 > "$reward"
else
    echo 0 > "$reward"
fi
