#!/bin/bash
# Reward 1 when backup.sh copies exactly the .txt files, with .bak names, and prints the count.
reward=/logs/verifier/reward.txt
cd /app || { echo 0 > "$reward"; exit 0; }
work=$(mktemp -d)
mkdir -p "$work/in/sub"
echo one > "$work/in/a.txt"
echo two > "$work/in/my notes.txt"
echo skip > "$work/in/image.png"
echo deep > "$work/in/sub/deep.txt"
out=$(./backup.sh "$work/in" "$work/out" 2>&1)
ok=1
[ -x backup.sh ] || ok=0
[ "$(cat "$work/out/a.txt.bak" 2>/dev/null)" = one ] || ok=0
[ "$(cat "$work/out/my notes.txt.bak" 2>/dev/null)" = two ] || ok=0
[ "$(ls "$work/out" 2>/dev/null | wc -l)" = 2 ] || ok=0
echo "$out" | grep -qw 2 || ok=0
[ -f "$work/in/a.txt" ] || ok=0
echo "backup.sh printed: $out"; ls -la "$work/out" 2>&1
rm -rf "$work"
echo "$ok" > "$reward"
