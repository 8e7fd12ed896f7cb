#!/bin/bash
# Reward 1 when merged.json is the deep merge, with lists replaced and nulls removing keys.
reward=/logs/verifier/reward.txt
cd /app || { echo 0 > "$reward"; exit 0; }
if python3 -c '
import json
merged = json.load(open("merged.json"))
assert merged == {
    "name": "shop",
    "server": {"host": "0.0.0.0", "port": 9090, "tls": {"enabled": True, "cert": "/etc/shop.pem"}},
    "features": ["search"],
    "limits": {"requests": 100, "window": 60},
    "owner": "ops",
}, merged
'; then
    echo 1 > "$reward"
else
    echo 0 > "$reward"
fi
