#!/bin/bash
awk '$2 == "ERROR" {n[$3]++} END {for (s in n) print s, n[s]}' app.log | sort -k2,2nr -k1,1 > errors.txt
