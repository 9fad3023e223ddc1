#!/usr/bin/env bash
# Debian packages some tests use, installed when missing (a no-op once they are there):
# PostgreSQL for the billing store tests, Chromium for the admin UI's browser test, g++ for the
# engine's CPU attention kernel. Without root they are left out and those tests skip, saying why.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "not root: ${missing[*]} not installed; the tests that need them will be skipped" >&2
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
