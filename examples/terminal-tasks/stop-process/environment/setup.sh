# Start the spinner in the background, detached from this shell's output.
nohup bash /app/spinner.sh > /dev/null 2>&1 &
echo $! > /app/.spinner-pid
sleep 0.5
