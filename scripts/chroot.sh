#!/usr/bin/env bash
# scripts/chroot.sh RELEASE [COMMAND...]: runs COMMAND (default: an interactive shell) in this
# checkout inside a Debian chroot that holds another PostgreSQL major version:
#   trixie  PostgreSQL 17 (Debian 13)
#   forky   PostgreSQL 18 (Debian's testing, made with debootstrap's sid script)
# The chroot is made with debootstrap when missing, under $PG_TIDE_CHROOTS
# (/var/cache/pg_tide/chroots by default, outside the checkout), with the release's PostgreSQL
# server, headers, pg_cron, clang for pgrx's bindings, and cargo-pgrx pointed at its pg_config.
# The Rust toolchain (~/.cargo, ~/.rustup) and the checkout are bind-mounted at their own paths,
# in a mount namespace of the command's own: nothing stays mounted after it ends. Builds go to
# the chroot's own target directory (/var/cache/pg_tide-target inside it). In the command's
# environment: PG_MAJOR, PG_CONFIG, PG_TIDE_PG_BIN (the pg_test tiers' PostgreSQL).
set -euo pipefail
cd "$(dirname "$0")/.."
release=${1:?usage: scripts/chroot.sh trixie|forky [command...]}
shift
case "$release" in
    trixie) major=17; script=trixie ;;
    forky) major=18; script=sid ;;
    *) echo "chroot.sh: no PostgreSQL release is known for '$release' (trixie: 17, forky: 18)" >&2; exit 2 ;;
esac
chroots=${PG_TIDE_CHROOTS:-/var/cache/pg_tide/chroots}
root=$chroots/$release
mirror=${PG_TIDE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
say() { printf '==> %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "chroot.sh: run as root (debootstrap, mounts, chroot); found uid $(id -u)" >&2
    exit 1
fi

# Packages in the chroot: what scripts/setup.sh installs on Debian 12 for the tiers that run in
# a chroot (the server, its headers, pg_cron, clang and libclang for bindgen, sudo for the
# tests' postgres user, dpkg-dev for the package, python3 for the package tier's checks).
packages=(postgresql-$major postgresql-server-dev-$major postgresql-$major-cron
          libclang-dev clang gcc libc6-dev make sudo ca-certificates dpkg-dev python3 procps)
home=$HOME
here=$PWD
# enter COMMAND...: COMMAND in the chroot, in this checkout, with /proc, /sys, /dev, a /dev/shm
# of its own, the toolchain and the checkout mounted; the mount namespace ends with the
# command, and so do its mounts.
enter() {
    unshare --mount --propagation private bash -euc '
    root=$1 home=$2 here=$3; shift 3
    for d in proc sys dev; do mkdir -p "$root/$d"; done
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mkdir -p "$root/dev/shm" && mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
    for d in "$home/.cargo" "$home/.rustup" "$here"; do
        mkdir -p "$root$d" && mount --bind "$d" "$root$d"
    done
    exec chroot "$root" sh -c "cd \"\$0\" && exec \"\$@\"" "$here" "$@"
    ' chroot-sh "$root" "$home" "$here" "$@"
}

stamp=$root/.pg_tide-ready
want="$release ${packages[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    if ! command -v debootstrap >/dev/null; then
        say "installing debootstrap"
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
    fi
    if [ ! -x "$root/usr/bin/apt-get" ]; then
        say "making a $release chroot in $root (debootstrap, minbase)"
        rm -rf "$root"
        mkdir -p "$chroots"
        debootstrap --variant=minbase "$release" "$root" "$mirror" "/usr/share/debootstrap/scripts/$script" \
            > "$chroots/$release-debootstrap.log" 2>&1 || {
            tail -20 "$chroots/$release-debootstrap.log" >&2
            exit 1
        }
    fi
    # The mirror here may serve a testing release whose Release file is past its Valid-Until date.
    echo "deb [check-valid-until=no] $mirror $release main" > "$root/etc/apt/sources.list"
    # Packages install without starting services (the tests start their own clusters), and
    # without Debian's "main" cluster.
    printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    mkdir -p "$root/etc/postgresql-common/createcluster.d"
    echo "create_main_cluster = false" > "$root/etc/postgresql-common/createcluster.d/pg_tide.conf"
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    say "installing PostgreSQL $major and the build tools into the $release chroot"
    enter /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -c "apt-get update -q && apt-get install -y -q --no-install-recommends ${packages[*]} && apt-get clean" \
        > "$chroots/$release-apt.log" 2>&1 || {
        tail -20 "$chroots/$release-apt.log" >&2
        exit 1
    }
    echo "$want" > "$stamp"
fi

# The host's name resolves inside as outside (sudo looks it up).
cp /etc/hosts "$root/etc/hosts" 2>/dev/null || true
pg_bin=/usr/lib/postgresql/$major/bin
inner=(/usr/bin/env -i HOME="$home" USER=root LANG=C.UTF-8 TERM="${TERM:-dumb}" ${CI:+CI=$CI}
       PATH="$home/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
       CARGO_TARGET_DIR=/var/cache/pg_tide-target PG_MAJOR="$major" PG_CONFIG="$pg_bin/pg_config"
       PG_TIDE_PG_BIN="$pg_bin" PG_TIDE_CHROOT="$release")
# cargo-pgrx learns the release's pg_config once (its config lives in the chroot's ~/.pgrx).
if ! grep -qs "^pg$major = \"$pg_bin/pg_config\"" "$root$home/.pgrx/config.toml"; then
    say "pointing cargo-pgrx in the $release chroot at PostgreSQL $major"
    enter "${inner[@]}" cargo pgrx init --pg"$major" "$pg_bin/pg_config" >/dev/null
fi
[ $# -gt 0 ] || set -- bash
enter "${inner[@]}" "$@"
