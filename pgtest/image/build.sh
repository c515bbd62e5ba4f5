#!/usr/bin/env bash
# build.sh builds a PostgreSQL Docker image without any registry, for
# pgtest's Docker mode (PGTEST_IMAGE) on machines that cannot pull: the root
# filesystem is assembled from this machine's own PostgreSQL installation —
# the server binaries, their data files and every shared library ldd finds —
# plus a shell, and imported with `docker import`. Its entrypoint,
# docker-entrypoint.sh, behaves as the official image's does for pgtest. A
# cluster initdb'd once, at build time, is committed into the image; the
# entrypoint copies it rather than running initdb when started with
# pgtest's settings (POSTGRES_HOST_AUTH_METHOD=trust, user postgres).
#
# Usage: pgtest/image/build.sh [IMAGE]    (default: pgtest-local/postgres:MAJOR)
# Environment: PGTEST_BINDIR, the PostgreSQL bin directory (default: the
# newest /usr/lib/postgresql/*/bin).
#
# The image is cached: when IMAGE exists with the label this script would
# give it (a hash of this script, the entrypoint and the postgres binary),
# nothing is built. It prints the image name on stdout, and what it did on
# stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

bindir=${PGTEST_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n | tail -n 1)}
if [ -z "$bindir" ] || [ ! -x "$bindir/postgres" ] || [ ! -x "$bindir/initdb" ]; then
	echo "build.sh: no PostgreSQL binaries (initdb, postgres) in ${bindir:-/usr/lib/postgresql/*/bin}; install postgresql or set PGTEST_BINDIR" >&2
	exit 1
fi
major=$("$bindir/postgres" --version | sed -E 's/.* ([0-9]+)(\.[0-9]+)*.*/\1/')
image=${1:-pgtest-local/postgres:$major}
build=$(cat "$0" "$here/docker-entrypoint.sh" "$bindir/postgres" | sha256sum | cut -c1-16)

have=$(docker image inspect -f '{{index .Config.Labels "org.pglocks.pgtest.build"}}' "$image" 2>/dev/null || true)
if [ "$have" = "$build" ]; then
	echo "build.sh: $image is up to date (build $build)" >&2
	echo "$image"
	exit 0
fi

start=$(date +%s.%N)
old=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
root=$(mktemp -d "${TMPDIR:-/tmp}/pg-image.XXXXXX")
trap 'rm -rf "$root"' EXIT

# Merged /usr, as Debian has it, so library paths from ldd land in place.
mkdir -p "$root"/usr/{bin,lib,lib64,local/bin,share} "$root"/{etc,tmp,var/lib/postgresql,var/run/postgresql}
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
# World-writable (sticky), so that the image needs no chown: the server
# runs as the postgres user, whoever built the image.
mkdir -p "$root"/usr/share/pgtest
chmod 1777 "$root"/tmp "$root"/var/lib/postgresql "$root"/var/run/postgresql "$root"/usr/share/pgtest

# copy PATH... copies files to the same path under $root, following symlinks.
copy() {
	for f in "$@"; do
		mkdir -p "$root$(dirname "$f")"
		cp -L "$f" "$root$f"
	done
}

pgroot=$(dirname "$bindir")              # /usr/lib/postgresql/15
share=$("$bindir/pg_config" --sharedir 2>/dev/null || echo "/usr/share/postgresql/$major")
mkdir -p "$root$pgroot" "$root$(dirname "$share")"
cp -a "$pgroot/." "$root$pgroot/"
# No JIT: llvmjit would bring libLLVM (100 MB); the server runs without it.
rm -rf "$root$pgroot"/lib/llvmjit* "$root$pgroot"/lib/bitcode
cp -a "$share" "$root$share"
[ -d /usr/share/zoneinfo ] && cp -a /usr/share/zoneinfo "$root/usr/share/"

# A shell and the few tools the entrypoint and pgtest's docker exec use.
for t in sh head cat cp rm mkdir ls env id sleep; do
	p=$(command -v "$t") || { echo "build.sh: no $t here" >&2; exit 1; }
	cp -L "$p" "$root/usr/bin/$t"
done

# Every shared library any binary or module needs (dlopened modules too).
mapfile -t objs < <(find "$root$pgroot" "$root/usr/bin" -type f \( -perm -u+x -o -name '*.so*' \) | sed "s|^$root||")
{ ldd "${objs[@]}" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $1 !~ /:$/ { print $1 }' | sort -u | while read -r lib; do
	[ -e "$root$lib" ] || copy "$lib"
done

cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
postgres:x:999:
GROUP
install -m 0755 "$here/docker-entrypoint.sh" "$root/usr/local/bin/docker-entrypoint.sh"

config=(
	--change "USER postgres"
	--change "ENV PATH=/usr/local/bin:$bindir:/usr/bin"
	--change "ENV PGDATA=/var/lib/postgresql/data"
	--change "ENTRYPOINT [\"docker-entrypoint.sh\"]"
	--change "CMD [\"postgres\"]"
	--change "EXPOSE 5432"
	--change "LABEL org.pglocks.pgtest.build=$build"
)
base=$image-base-$build
tar --numeric-owner --owner=0 --group=0 -C "$root" -c . | docker import "${config[@]}" - "$base" >/dev/null
# A cluster made once, here, that the entrypoint copies instead of running
# initdb when started as pgtest starts it (trust, user postgres): initdb
# takes seconds, a copy milliseconds.
maker=pgtest-image-build-$$
if ! out=$(docker run --name "$maker" --entrypoint sh "$base" -c 'PGDATA=/usr/share/pgtest/cluster \
	POSTGRES_HOST_AUTH_METHOD=trust POSTGRES_INITDB_ARGS=--no-sync docker-entrypoint.sh postgres --version' 2>&1); then
	echo "$out" >&2
	docker rm "$maker" >/dev/null 2>&1 || true
	docker rmi "$base" >/dev/null 2>&1 || true
	exit 1
fi
docker commit "${config[@]}" "$maker" "$image" >/dev/null
docker rm "$maker" >/dev/null
docker rmi "$base" >/dev/null
new=$(docker image inspect -f '{{.Id}}' "$image")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
	docker rmi "$old" >/dev/null 2>&1 || true # an outdated build, unless a container uses it
fi
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
size=$(docker image inspect -f '{{.Size}}' "$image")
echo "build.sh: built $image (build $build, $((size / 1024 / 1024)) MB) in ${took}s" >&2
echo "$image"
