#!/usr/bin/env bash
# Sets up everything cmq needs on a fresh machine: a virtual environment in
# .venv with the package and its extras (the test extra includes the docs
# extra: MkDocs, to build the documentation site), and, when run as root on Debian, the
# few system tools the lab and tests use (iptables for packet loss, redis-server
# for Redis Cluster tests, chromium to check the lab's report page, wrk as the
# queue service benchmark's compiled load generator). Safe to
# run again: it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv" >&2
    "$PY" -m venv .venv
    .venv/bin/pip install -q --upgrade pip
fi
stamp=.venv/.cmq-installed
# Installing also builds the compiled core (src/cmq/_speedups.pyx, with gcc
# and the Python headers); without them cmq runs its pure-Python core and the
# install says so. A changed core source is rebuilt on the next run.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
        || [ src/cmq/_speedups.pyx -nt "$stamp" ]; then
    echo "bootstrap: installing pycmq[test] into .venv and building its compiled core (first time: a few minutes)" >&2
    .venv/bin/pip install -q -e '.[test]'
    touch "$stamp"
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=()
    command -v iptables >/dev/null || missing+=(iptables)
    command -v redis-server >/dev/null || missing+=(redis-server)
    command -v ip >/dev/null || missing+=(iproute2)
    command -v chromium >/dev/null || missing+=(chromium)
    command -v wrk >/dev/null || missing+=(wrk)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "bootstrap: apt-get install ${missing[*]}" >&2
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
            || echo "bootstrap: could not install ${missing[*]}; tests that need them will skip" >&2
    fi
fi
