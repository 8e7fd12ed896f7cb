#!/bin/bash
# Reward 1 when sorted.txt holds each distinct name of names.txt once, in order.
reward=/logs/verifier/reward.txt
cd /app || { echo 0 > "$reward"; exit 0; }
expected=$(printf 'Alex\nBen\nCarla\nMara\nZoe\nmara\n' | LC_ALL=C sort)
actual=$(LC_ALL=C sort sorted.txt 2>/dev/null)
if [ -f sorted.txt ] && [ "$actual" = "$expected" ] && cmp -s <(LC_ALL=C sort sorted.txt) sorted.txt; then
    echo 1 > "$reward"
else
    echo "sorted.txt is missing, incomplete or out of order" >&2
    echo 0 > "$reward"
fi
