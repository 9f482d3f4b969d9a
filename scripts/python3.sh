#!/usr/bin/env bash
# Prints the path of a python3 (3.9 or newer) for the vllm-omni stage
# worker's tests, installing Debian's when there is none: the tests use the
# standard library only, so nothing else is installed.
#
#   ./scripts/python3.sh     the interpreter's path on stdout
#
# OMNIPD_PYTHON, when set, names the interpreter to use instead.
set -euo pipefail

usable() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' 2>/dev/null; }

if [ -n "${OMNIPD_PYTHON:-}" ]; then
  if usable "$OMNIPD_PYTHON"; then echo "$OMNIPD_PYTHON"; exit 0; fi
  echo "python3.sh: OMNIPD_PYTHON=$OMNIPD_PYTHON is not a python3 of 3.9 or newer" >&2
  exit 1
fi
for candidate in /usr/bin/python3 "$(command -v python3 || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && usable "$candidate"; then
    echo "$candidate"
    exit 0
  fi
done
if ! command -v apt-get >/dev/null; then
  echo "python3.sh: no python3 (3.9 or newer) and no apt-get to install one; install python3 and run again" >&2
  exit 1
fi
sudo=
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "python3.sh: no python3, and installing Debian's needs root (apt-get install python3)" >&2
    exit 1
  fi
  sudo=sudo
fi
echo "python3.sh: installing Debian's python3 (apt-get install python3)" >&2
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3 >&2
if ! usable /usr/bin/python3; then
  echo "python3.sh: apt-get installed python3, but /usr/bin/python3 does not run" >&2
  exit 1
fi
echo /usr/bin/python3
