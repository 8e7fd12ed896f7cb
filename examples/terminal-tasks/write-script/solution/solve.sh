#!/bin/bash
cat > backup.sh <<'SCRIPT'
#!/bin/bash
set -euo pipefail
src=$1 dest=$2
mkdir -p "$dest"
n=0
for f in "$src"/*.txt; do
    [ -f "$f" ] || continue
    cp -- "$f" "$dest/$(basename "$f").bak"
    n=$((n + 1))
done
echo "$n"
SCRIPT
chmod +x backup.sh
