#!/bin/bash
LC_ALL=C sort -u names.txt > sorted.txt
