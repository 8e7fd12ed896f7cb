#!/bin/sh
# `tether run --mcp URL` under the conformance suite, as a user types it: the scenario's
# context (pre-registered credentials) is written to a file given with --mcp-auth (the
# client-credentials grant where the scenario tests it), a sign-in opens browser.py, and a
# scripted model calls the tool named in $TETHER_CONFORMANCE_TOOL (if any), then answers.
#   sh cli.sh SERVER_URL          (the suite appends the URL)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py="$here/../../.venv/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" - "$work" <<'PY'
import json, os, sys
context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
auth = {k: context[k] for k in ("client_id", "client_secret") if k in context}
if "client-credentials" in os.environ.get("MCP_CONFORMANCE_SCENARIO", ""):
    auth["grant"] = "client_credentials"
tool = os.environ.get("TETHER_CONFORMANCE_TOOL")
turns = [{"tool_calls": [{"name": tool, "arguments": {}}]}] if tool else []
turns.append({"text": "Done."})
open(os.path.join(sys.argv[1], "auth.json"), "w").write(json.dumps(auth))
open(os.path.join(sys.argv[1], "script.json"), "w").write(json.dumps(turns))
PY
export BROWSER="$py $here/browser.py %s" XDG_DATA_HOME="$work/data"
"$here/../../.venv/bin/tether" run "Use the server's tools." --store memory \
    --provider scripted --script "$work/script.json" --tools none --approve auto \
    --mcp-auth "$work/auth.json" --mcp "$1"
