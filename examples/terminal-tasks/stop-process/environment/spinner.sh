#!/bin/bash
while true; do date +%s%N >> spin.log; sleep 0.2; done
