#!/bin/sh
# The container's entry point.
#   serve (default)  exec `aieng serve`: gunicorn's master is PID 1 and gets SIGTERM itself
#   init             prepare the store volume: with AIENG_MODEL=demo (the default) and no current
#                    demo in it, build, evaluate and promote the demo model (minutes on a CPU);
#                    any other model must already be registered (`aieng model register`): init
#                    re-hashes its files and exits 1 naming what is wrong
#   anything else    run as an aieng command: `docker run IMAGE model list`
set -eu
store=${AIENG_STORE:?AIENG_STORE is not set}
model=${AIENG_MODEL:-demo}
name=${model%%@*}

case "${1:-serve}" in
  serve)
    [ $# -gt 0 ] && shift
    exec aieng serve "$@" ;;
  init)
    mkdir -p "$store"
    if [ "$name" = "demo" ]; then  # idempotent: says so and does nothing when demo is current
      exec aieng --store "$store" demo install
    fi
    # any other model: it must be in the store already; verify its files now, before any replica starts
    exec aieng --store "$store" model verify "$model" ;;
  *)
    exec aieng "$@" ;;
esac
