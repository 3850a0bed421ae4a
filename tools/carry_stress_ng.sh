#!/usr/bin/env bash
# Packs this host's stress-ng and the shared libraries it needs (all but the C library) into .deps/stress-ng, for the
# GPU box, which has neither stress-ng nor a network (carry .deps; tools/gpu_run.sh stage rt puts it on PATH).
# bin/stress-ng is a wrapper that points the loader at lib/ for stress-ng alone, so nothing else sees those libraries.
# Usage: tools/carry_stress_ng.sh   (needs stress-ng installed here: apt-get install -y stress-ng)
set -euo pipefail
cd "$(dirname "$0")/.."
real=$(command -v stress-ng) || { echo "carry_stress_ng.sh: stress-ng is not installed here" >&2; exit 2; }
dst=.deps/stress-ng
rm -rf "$dst" && mkdir -p "$dst/bin" "$dst/lib" "$dst/libexec"
cp "$real" "$dst/libexec/stress-ng"
ldd "$real" | awk '/=> \//{print $3}' | while read -r lib; do
    case $(basename "$lib") in libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;; *) cp -L "$lib" "$dst/lib/" ;; esac
done
cat > "$dst/bin/stress-ng" <<'WRAP'
#!/bin/sh
here=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH=$here/lib exec "$here/libexec/stress-ng" "$@"
WRAP
chmod +x "$dst/bin/stress-ng"
"$dst/bin/stress-ng" --version
du -sh "$dst"
