#!/bin/bash
pid=$(pgrep -f "$PWD/spinner.sh" | head -n 1)
pkill -f "$PWD/spinner.sh"
echo "$pid" > pid.txt
