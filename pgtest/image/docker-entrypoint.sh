#!/bin/sh
# Entrypoint of pgtest's locally built PostgreSQL image (see build.sh): what
# the official postgres image's docker-entrypoint.sh does, for what pgtest
# and most test suites use. "docker-entrypoint.sh postgres ARGS" initializes
# $PGDATA on first start and then runs postgres ARGS listening on every
# address. Honoured: POSTGRES_USER (default postgres), POSTGRES_PASSWORD,
# POSTGRES_HOST_AUTH_METHOD (trust, md5, scram-sha-256; default
# scram-sha-256, which needs POSTGRES_PASSWORD), POSTGRES_DB (default: the
# user's name), POSTGRES_INITDB_ARGS. Not honoured: /docker-entrypoint-initdb.d.
# With trust, user and database postgres, no password and no initdb
# arguments but --no-sync, the cluster build.sh made is copied instead of
# running initdb.
set -e
if [ "$1" != postgres ]; then
	exec "$@"
fi
shift
: "${PGDATA:=/var/lib/postgresql/data}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
auth=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
cluster=/usr/share/pgtest/cluster # made by build.sh with the defaults below
if [ ! -s "$PGDATA/PG_VERSION" ] && [ -s "$cluster/PG_VERSION" ] && [ "$user" = postgres ] &&
	[ "$db" = postgres ] && [ "$auth" = trust ] && [ -z "$POSTGRES_PASSWORD" ] &&
	{ [ -z "$POSTGRES_INITDB_ARGS" ] || [ "$POSTGRES_INITDB_ARGS" = --no-sync ]; }; then
	# pgtest's case: a copy of the cluster initdb made at build time.
	cp -a "$cluster" "$PGDATA"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ "$auth" != trust ] && [ -z "$POSTGRES_PASSWORD" ]; then
		echo "docker-entrypoint.sh: set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust" >&2
		exit 1
	fi
	pwfile=/tmp/pgtest-initdb-pw
	printf '%s\n' "${POSTGRES_PASSWORD:-postgres}" >"$pwfile"
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of words
	initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --locale=C $POSTGRES_INITDB_ARGS >/dev/null
	rm -f "$pwfile"
	printf 'host all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"
	printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	if [ "$db" != postgres ]; then
		echo "create database \"$db\"" | postgres --single -D "$PGDATA" -j postgres >/dev/null
	fi
fi
exec postgres "$@"
