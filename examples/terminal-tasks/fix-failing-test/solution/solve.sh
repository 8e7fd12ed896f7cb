#!/bin/bash
sed -i 's/ordered\[middle\] + ordered\[middle + 1\]/ordered[middle - 1] + ordered[middle]/' stats.py
