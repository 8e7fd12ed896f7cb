#!/bin/bash
# Reward 1 when clean.csv is valid CSV holding exactly the clean rows, in order.
reward=/logs/verifier/reward.txt
cd /app || { echo 0 > "$reward"; exit 0; }
if python3 -c '
import csv
with open("clean.csv", newline="") as f:
    rows = list(csv.reader(f))
assert rows == [
    ["name", "email", "age"],
    ["Ada Lovelace", "ada@example.com", "36"],
    ["bob smith", "bob@example.com", "41"],
    ["Eve", "eve@example.net", "22"],
    ["Smith, Jane", "jane@example.com", "29"],
], rows
'; then
    echo 1 > "$reward"
else
    echo 0 > "$reward"
fi
