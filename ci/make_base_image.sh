#!/usr/bin/env bash
# A local stand-in for the official python:3.11-slim-bookworm image, for machines that reach
# Debian's archive and PyPI but no image registry (make docker-test uses it there):
#   ci/make_base_image.sh TAG
# Debian bookworm (debootstrap minbase) with Debian's Python 3.11, venv, pip and the headers,
# trimmed like Debian's slim images (no docs, man pages or apt lists; services not started by
# package scripts), then `docker import`ed as TAG. The official image has Python built from
# source in /usr/local; here /usr/local/bin/python{,3} and pip point to Debian's. What this
# machine needs to reach its package sources goes in too: its Debian mirror (from
# /etc/apt/sources.list*), the apt settings that reach it (Acquire::Check-Valid-Until,
# Acquire::Check-Date, proxies), its CA certificates (a TLS-intercepting proxy's CA included) and
# its pip index settings, so that the image build's `apt-get` and `pip install` use the same
# sources as this machine. Needs root, debootstrap and a Docker client ($DOCKER, default docker).
set -euo pipefail
trap 'echo "ci/make_base_image.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
TAG=${1:?usage: ci/make_base_image.sh TAG}
DOCKER=${DOCKER:-docker}
[ "$(id -u)" = 0 ] || { echo "ci/make_base_image.sh: debootstrap needs root"; exit 1; }
command -v debootstrap >/dev/null || { echo "ci/make_base_image.sh: needs debootstrap (bash ci/install_system.sh --ci)"; exit 1; }

# The first Debian archive and security URIs of this machine's apt sources (comments skipped).
apt_uris() {
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    sed -n -E 's/^[[:space:]]*URIs:[[:space:]]*//p; s/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/p' "$f"
  done | tr ' ' '\n' | sed 's:/*$::'
}
MIRROR=${DEBIAN_MIRROR:-$(apt_uris | grep -E '/debian$' | head -n 1 || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=$(apt_uris | grep -E '/debian-security$' | head -n 1 || true)
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/embedlab-base.XXXXXX")
ROOTFS=$WORK/rootfs
DEBOOTSTRAP_PID=""
cleanup() {
  local rc=$?
  set +e
  if [ -n "$DEBOOTSTRAP_PID" ] && kill -0 "$DEBOOTSTRAP_PID" 2>/dev/null; then
    pkill -TERM -P "$DEBOOTSTRAP_PID"; kill -TERM "$DEBOOTSTRAP_PID" 2>/dev/null; wait "$DEBOOTSTRAP_PID"
  fi
  # debootstrap mounts /proc and /sys (and may bind /dev) inside the root: unmount before removing.
  findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" || true; done
  rm -rf --one-file-system "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "   debootstrap bookworm from $MIRROR (minbase + python3, python3-venv, python3-dev, python3-pip)"
# In the background and waited for, so that TERM/INT reach the cleanup at once.
debootstrap --variant=minbase --include=ca-certificates,netbase,tzdata,python3,python3-venv,python3-dev,python3-pip \
  bookworm "$ROOTFS" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 &
DEBOOTSTRAP_PID=$!
rc=0; wait "$DEBOOTSTRAP_PID" || rc=$?
DEBOOTSTRAP_PID=""
if [ "$rc" != 0 ]; then
  tail -n 30 "$WORK/debootstrap.log"; echo "ci/make_base_image.sh: debootstrap failed (exit $rc)"; exit 1
fi

# Debian's slim-image settings: no docs/man/locales from later installs, no apt caches, package
# scripts do not start services in a build.
cat > "$ROOTFS/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
cat > "$ROOTFS/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'Acquire::Languages "none";' > "$ROOTFS/etc/apt/apt.conf.d/docker-no-languages"
printf '#!/bin/sh\nexit 101\n' > "$ROOTFS/usr/sbin/policy-rc.d"; chmod +x "$ROOTFS/usr/sbin/policy-rc.d"

# This machine's package sources.
rm -f "$ROOTFS/etc/apt/sources.list"
cat > "$ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
for f in /etc/apt/apt.conf /etc/apt/apt.conf.d/*; do
  [ -f "$f" ] && grep -q -E '^[^/#]*Acquire::(Check-Valid-Until|Check-Date|https?::Proxy|Proxy)' "$f" || continue
  echo "   apt settings from $f"
  cp "$f" "$ROOTFS/etc/apt/apt.conf.d/90host-$(basename "$f")"
done
# This machine's CA bundle as a local CA file: update-ca-certificates keeps it in the image's
# bundle (also when a later install of ca-certificates rebuilds it).
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/usr/local/share/ca-certificates/host-ca-bundle.crt"
chroot "$ROOTFS" update-ca-certificates > "$WORK/update-ca.log" 2>&1 || { cat "$WORK/update-ca.log"; exit 1; }
# pip: Debian's CA bundle instead of pip's own, and this machine's package indexes (http(s) only;
# local file:// indexes do not exist in the image).
{
  echo "[global]"
  echo "cert = /etc/ssl/certs/ca-certificates.crt"
  python3 -m pip config list 2>/dev/null | sed -n -E "s/^[^.]*\.(index-url|extra-index-url|trusted-host)='(.*)'$/\1 \2/p" |
    while read -r key values; do
      keep=$(printf '%s\n' $values | { grep -v -E '^file:' || true; } | tr '\n' ' ' | sed 's/ $//')
      if [ -n "$keep" ]; then echo "$key = $keep"; fi
    done
} > "$ROOTFS/etc/pip.conf"
echo "   pip settings: $(grep -v '^\[' "$ROOTFS/etc/pip.conf" | tr '\n' ';')"

# Where the official image has its Python; pip in a system Python (only venvs are used here).
ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python3"
ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python"
ln -sf /usr/bin/pip3 "$ROOTFS/usr/local/bin/pip"
rm -f "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED
# Trim like the slim image: no package lists, caches, docs or man pages.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* "$ROOTFS"/var/cache/debconf/*-old \
       "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/usr/share/locale/* "$ROOTFS"/var/log/*.log
find "$ROOTFS/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
echo "   $(chroot "$ROOTFS" python3 --version), $(du -sm --one-file-system "$ROOTFS" | cut -f1) MB"

tar --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -C "$ROOTFS" -c . |
  "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "embedlab local base: Debian bookworm + Debian's Python 3.11 (stand-in for python:3.11-slim-bookworm)" \
    - "$TAG" >/dev/null
echo "   imported as $TAG"
