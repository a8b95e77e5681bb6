#!/bin/sh
# The database server the sweep's tests share a study through: Debian's postgresql (the tests start their own
# server in a temporary folder on a local socket; nothing listens on the network). Idempotent: does nothing when
# initdb is already installed; installs with apt-get only as root on a Debian/Ubuntu machine, and otherwise says why
# the PostgreSQL tests will be skipped.
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing postgresql for the sweep's shared-study tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null \
    || echo "could not install postgresql: the sweep's PostgreSQL tests will be skipped"
else
  echo "initdb not found and not root with apt-get: the sweep's PostgreSQL tests will be skipped" \
       "(install Debian's postgresql to run them)"
fi
exit 0
