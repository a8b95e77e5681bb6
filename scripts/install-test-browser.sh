#!/bin/sh
# The browser the HTML report's tests drive: Debian's chromium + chromium-driver (no download at test time).
# Idempotent: does nothing when chromedriver is already on PATH; installs with apt-get only as root on a
# Debian/Ubuntu machine, and otherwise says why the browser tests will be skipped.
if command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver for the HTML report's browser tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null \
    || echo "could not install chromium: the report's browser tests will be skipped"
else
  echo "chromedriver not found and not root with apt-get: the report's browser tests will be skipped" \
       "(install chromium and chromium-driver to run them)"
fi
exit 0
