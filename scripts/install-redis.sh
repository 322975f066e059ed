#!/usr/bin/env bash
# install-redis.sh makes redis-server and redis-cli available on PATH for the
# tests (internal/redistest starts real redis-server processes on free
# loopback ports; it never uses a service on 6379).
#
# If both are already on PATH it prints their versions and exits 0.
# Otherwise it installs the Debian/Ubuntu package redis-server (which brings
# redis-tools, and so redis-cli) with apt-get, as root or through sudo.
# Installing the package may start a redis-server service on 127.0.0.1:6379;
# that is harmless, the tests never connect to it.
set -euo pipefail

have_redis() {
	command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1
}

print_versions() {
	echo "redis-server: $(command -v redis-server): $(redis-server --version)"
	echo "redis-cli: $(command -v redis-cli): $(redis-cli --version)"
}

if have_redis; then
	print_versions
	exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-redis.sh: redis-server/redis-cli not found and apt-get is unavailable;" >&2
	echo "install Redis (7.x recommended) with your package manager, e.g. 'brew install redis' or 'dnf install redis'." >&2
	exit 1
fi

if [[ "$(id -u)" -eq 0 ]]; then
	as_root() { "$@"; }
elif command -v sudo >/dev/null 2>&1; then
	as_root() { sudo "$@"; }
else
	echo "install-redis.sh: redis-server/redis-cli not found, and installing them needs root:" >&2
	echo "run this script as root, install sudo, or run 'apt-get install redis-server' as root." >&2
	exit 1
fi

echo "install-redis.sh: installing redis-server (and redis-tools) with apt-get" >&2
as_root apt-get update -qq
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server

if ! have_redis; then
	echo "install-redis.sh: apt-get finished but redis-server or redis-cli is still not on PATH ($PATH)" >&2
	exit 1
fi
print_versions
