#!/bin/bash
python3 - <<'PY'
import json


def merge(base, over):
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


with open("defaults.json") as d, open("local.json") as l:
    merged = merge(json.load(d), json.load(l))
with open("merged.json", "w") as f:
    json.dump(merged, f, indent=2)
PY
