#!/usr/bin/env bash
# `make package` (scripts/package.sh [all|extension|console]): Debian packages built from this
# tree, into target/:
#   postgresql-15-pg-tide_<version>-1_<arch>.deb   pg_tide for PostgreSQL 15 (Debian 12)
#   postgresql-17-pg-tide_<version>-1_<arch>.deb   pg_tide for PostgreSQL 17 (Debian 13, trixie)
#   postgresql-18-pg-tide_<version>-1_<arch>.deb   pg_tide for PostgreSQL 18 (Debian forky)
#   pg-tide-console_<version>-1_<arch>.deb         the web console, as a systemd service (Debian 12)
# Each extension package is built in its own release (17 and 18 in the chroots of
# scripts/chroot.sh), against that release's PostgreSQL and libraries. It holds the library, the
# current install script, the upgrade scripts and the frozen install scripts of earlier versions
# (so `ALTER EXTENSION pg_tide UPDATE` works from any of them), the license and the README, and
# depends on the release's postgresql-N and the libraries the .so links.
# `extension` builds the one for the PostgreSQL of $PG_CONFIG (15 by default) here; `console`
# the console; `all` (the default) the console and all three.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
what=${1:-all}
case "$what" in all|extension|console) ;; *) echo "package.sh: all, extension or console, not '$what'" >&2; exit 2 ;; esac
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
name=postgresql-$major-pg-tide
deb="target/${name}_${version}-1_${arch}.deb"
target_dir=${CARGO_TARGET_DIR:-target}

# The shared libraries a binary of package $1 needs, as Debian names their packages
# (dpkg-shlibdeps reads a debian/control of its own: it gets a minimal one in a scratch
# directory).
shlibs_of() {
    local scratch file
    scratch=$(mktemp -d)
    mkdir -p "$scratch/debian"
    printf 'Source: pg-tide\n\nPackage: %s\nArchitecture: any\n' "$1" > "$scratch/debian/control"
    file=$(realpath "$2")
    (cd "$scratch" && dpkg-shlibdeps -O --ignore-missing-info "$file" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
    rm -rf "$scratch"
}

# Builds the package staged in $1 into $2: the checksums of its files (for dpkg --verify and
# debsums; conffiles under /etc are tracked by dpkg apart), then the .deb.
build_deb() {
    (cd "$1" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
        > "$1/DEBIAN/md5sums"
    dpkg-deb --root-owner-group --build "$1" "$2" >/dev/null
    echo "==> $2"
    dpkg-deb --info "$2" | sed -n 's/^ \(Package\|Version\|Depends\):/  \1:/p'
}

build_extension() {
echo "==> building pg_tide $version for PostgreSQL $major (release) with cargo pgrx package"
cargo pgrx package --pg-config "$PG_CONFIG" >/dev/null
built=$target_dir/release/pg_tide-pg$major
libdir=$("$PG_CONFIG" --pkglibdir)
extdir=$("$PG_CONFIG" --sharedir)/extension

stage=target/deb/$name
rm -rf "$stage"
mkdir -p "$stage/DEBIAN" "$stage$libdir" "$stage$extdir" "$stage/usr/share/doc/$name"
install -m 644 "$built$libdir/pg_tide.so" "$stage$libdir/"
install -m 644 "$built$extdir"/pg_tide* "$stage$extdir/"
bash scripts/frozen.sh "$stage$extdir"
install -m 644 LICENSE "$stage/usr/share/doc/$name/copyright"
install -m 644 README.md "$stage/usr/share/doc/$name/README.md"
strip --strip-unneeded "$stage$libdir/pg_tide.so"

libs=$(shlibs_of "$name" "$stage$libdir/pg_tide.so")
size=$(du -sk "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: $name
Version: $version-1
Architecture: $arch
Maintainer: The pg_tide contributors <pg_tide@localhost>
Depends: postgresql-$major${libs:+, $libs}
Section: database
Priority: optional
Installed-Size: $size
Description: reliable scheduled work inside PostgreSQL $major
 pg_tide owns the whole life of a scheduled run inside PostgreSQL: business windows in the
 task's own time zone and across DST, readiness checks, an idempotency key per window, leases
 with fencing tokens, retries with backoff, dead letters and replay, backfills,
 reconciliation, heartbeats and alerts.
 .
 Add pg_tide to shared_preload_libraries, set pg_tide.database, restart, then
 CREATE EXTENSION pg_tide as a superuser.
CONTROL
build_deb "$stage" "$deb"
}

# The console: its binary, a systemd unit that runs it as a user of its own (DynamicUser) with
# its options from /etc/pg-tide-console/console.env (a conffile, readable by root alone: systemd
# reads it before it starts the console), and its documentation.
build_console() {
cname=pg-tide-console
cdeb="target/${cname}_${version}-1_${arch}.deb"
echo "==> building pg_tide-console $version (release)"
cargo build -q --release -p pg_tide_console
cstage=target/deb/$cname
rm -rf "$cstage"
mkdir -p "$cstage/DEBIAN" "$cstage/usr/bin" "$cstage/lib/systemd/system" "$cstage/etc/$cname" \
    "$cstage/usr/share/doc/$cname"
install -m 755 target/release/pg_tide-console "$cstage/usr/bin/"
strip --strip-unneeded "$cstage/usr/bin/pg_tide-console"
install -m 644 console/packaging/pg-tide-console.service "$cstage/lib/systemd/system/"
install -m 600 console/packaging/console.env "$cstage/etc/$cname/console.env"
install -m 644 LICENSE "$cstage/usr/share/doc/$cname/copyright"
install -m 644 docs/console.md "$cstage/usr/share/doc/$cname/console.md"
echo "/etc/$cname/console.env" > "$cstage/DEBIAN/conffiles"
# systemd learns of the unit; it is not enabled: the database URL is set first.
cat > "$cstage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
    if systemctl is-active --quiet pg-tide-console; then systemctl restart pg-tide-console || true; fi
fi
exit 0
POSTINST
cat > "$cstage/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop pg-tide-console >/dev/null 2>&1 || true
    systemctl disable pg-tide-console >/dev/null 2>&1 || true
fi
exit 0
PRERM
cat > "$cstage/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null || true; fi
exit 0
POSTRM
chmod 755 "$cstage/DEBIAN/postinst" "$cstage/DEBIAN/prerm" "$cstage/DEBIAN/postrm"
clibs=$(shlibs_of "$cname" "$cstage/usr/bin/pg_tide-console")
csize=$(du -sk "$cstage" | cut -f1)
cat > "$cstage/DEBIAN/control" <<CONTROL
Package: $cname
Version: $version-1
Architecture: $arch
Maintainer: The pg_tide contributors <pg_tide@localhost>
Depends: ${clibs:-libc6}
Recommends: systemd
Section: database
Priority: optional
Installed-Size: $csize
Description: web console of pg_tide, reliable scheduled work inside PostgreSQL
 Server-rendered pages over pg_tide's SQL API, signed in as a PostgreSQL role: what is
 failing, worst first, charts of runs and durations, and buttons to replay dead runs,
 acknowledge alerts and pause backfills. Runs as the systemd service pg-tide-console.
 .
 Set the database URL in /etc/pg-tide-console/console.env, then
 systemctl enable --now pg-tide-console.
CONTROL
build_deb "$cstage" "$cdeb"
}

case "$what" in
    extension) build_extension ;;
    console) build_console ;;
    all)
        build_extension
        build_console
        for release in trixie forky; do
            bash scripts/chroot.sh "$release" bash scripts/package.sh extension
        done
        ;;
esac
