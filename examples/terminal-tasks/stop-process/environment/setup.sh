# Start the spinner in the background, detached from this shell's output.
nohup bash "$APP_DIR/spinner.sh" > /dev/null 2>&1 &
echo $! > "$APP_DIR/.spinner-pid"
sleep 0.5
