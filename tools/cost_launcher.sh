#!/usr/bin/env bash
# Compiler/linker launcher for build-cost studies: runs the command and appends "user_s sys_s wall_s output" to
# $TIMELOG, so a build's CPU seconds per TU and per link can be summed on a shared machine (wall time cannot).
# Use: cmake ... -DCMAKE_CXX_COMPILER_LAUNCHER=$PWD/tools/cost_launcher.sh (and _C_, _CXX_LINKER_, _C_LINKER_).
out="?"
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out="$a"
  prev="$a"
done
exec /usr/bin/time -f "%U %S %e $out" -a -o "${TIMELOG:?cost_launcher.sh: set TIMELOG to the log file}" "$@"
