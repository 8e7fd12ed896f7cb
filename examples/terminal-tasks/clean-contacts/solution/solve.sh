#!/bin/bash
python3 - <<'PY'
import csv, re

seen, rows = set(), []
with open("contacts.csv", newline="") as f:
    for row in csv.DictReader(f):
        name, email, age = ((row.get(k) or "").strip() for k in ("name", "email", "age"))
        email = email.lower()
        if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email) or not age.isdigit():
            continue
        if email not in seen:
            seen.add(email)
            rows.append((name, email, age))
with open("clean.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["name", "email", "age"])
    w.writerows(sorted(rows, key=lambda r: r[1]))
PY
