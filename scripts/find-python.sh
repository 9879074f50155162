#!/bin/sh
# scripts/find-python.sh X.Y: the path of a CPython X.Y interpreter on this machine, or
# exit 1 saying where it looked. It looks on PATH (pythonX.Y), in /usr/bin and
# /usr/local/bin, then among pyenv's versions (whose shims answer only for the versions
# pyenv has selected, so its interpreters are taken from its versions folder directly).
set -eu
want=$1
candidates="$(command -v "python$want" 2>/dev/null || true) /usr/bin/python$want /usr/local/bin/python$want"
if command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root)
    # the newest patch release first
    for dir in $(ls -d "$root/versions/$want".* 2>/dev/null | sort -rV); do
        candidates="$candidates $dir/bin/python$want"
    done
fi
for python in $candidates; do
    [ -x "$python" ] || continue
    if [ "$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]; then
        echo "$python"
        exit 0
    fi
done
echo "no Python $want here (looked for python$want on PATH, in /usr/bin, /usr/local/bin and pyenv's versions)" >&2
exit 1
