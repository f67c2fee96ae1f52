#!/bin/sh
# package.sh — CI's check of the deployment files (docs/ops.md): builds the
# Debian package from this checkout's files in a scratch directory (never the
# tree's parent; the test suite is not run again: CI ran it), then checks
# what the .deb holds (dpkg -c, conffiles, maintainer scripts), runs the
# packaged binary's -V, verifies the packaged unit with systemd-analyze
# verify (any message fails), and runs lintian (errors and warnings fail).
# Prints how long each step took. OUT=DIR keeps the packages there.
set -eu
cd "$(dirname "$0")/.."
WORK=$(mktemp -d /tmp/sluice-pkg.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() {
    echo "package: FAIL: $*" >&2
    exit 1
}
now() { date +%s; }
step() {
    t=$(now)
    echo "package: $1 ($((t - T0))s)"
}
T0=$(now)

VERSION=$(dpkg-parsechangelog -l debian/changelog -S Version)
MKVERSION=$(sed -n 's/^VERSION *:= *//p' Makefile)
[ "$VERSION" = "$MKVERSION" ] || fail "debian/changelog says $VERSION, Makefile VERSION $MKVERSION"

# The files a commit would hold (tracked and new, not ignored), as they are.
SRC="$WORK/sluice-$VERSION"
mkdir -p "$SRC"
git ls-files -z --cached --others --exclude-standard |
    tar --null -T - -cf - | tar -xf - -C "$SRC"
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || COMMIT="$COMMIT-dirty"

step "building sluice $VERSION ($COMMIT)"
if ! (cd "$SRC" && SLUICE_COMMIT="$COMMIT" DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" \
    dpkg-buildpackage -us -uc -b >"$WORK/build.log" 2>&1); then
    tail -40 "$WORK/build.log" >&2
    fail "dpkg-buildpackage"
fi
DEB="$WORK/sluice_${VERSION}_$(dpkg --print-architecture).deb"
[ -f "$DEB" ] || fail "no $DEB"
step "built $(basename "$DEB") ($(stat -c %s "$DEB") bytes)"

# Contents: path and mode of each file the issue asks for.
dpkg -c "$DEB" >"$WORK/contents"
for want in \
    "-rwxr-xr-x ./usr/sbin/sluice" \
    "-rw-r--r-- ./lib/systemd/system/sluice.service" \
    "-rw-r--r-- ./etc/sluice/sluice.yaml" \
    "-rw-r--r-- ./etc/logrotate.d/sluice" \
    "-rw------- ./etc/default/sluice" \
    "-rw-r--r-- ./usr/share/man/man8/sluice.8.gz" \
    "drwxr-xr-x ./var/lib/sluice/" \
    "drwxr-xr-x ./var/log/sluice/"; do
    mode=${want%% *}
    path=${want#* }
    awk -v m="$mode" -v p="$path" '$1 == m && $6 == p { f = 1 } END { exit !f }' \
        "$WORK/contents" || fail "dpkg -c: no $path with mode $mode"
done
dpkg-deb --ctrl-tarfile "$DEB" | tar -xf - -C "$WORK" ./conffiles ./postinst ./postrm
for c in /etc/sluice/sluice.yaml /etc/logrotate.d/sluice /etc/default/sluice; do
    grep -qx "$c" "$WORK/conffiles" || fail "$c is not a conffile"
done
tr -d '\\\n' <"$WORK/postinst" | grep -q "adduser.*--system.*--home /var/lib/sluice.* sluice" ||
    fail "postinst makes no sluice user"
grep -q "deb-systemd-helper" "$WORK/postinst" || fail "postinst does not enable the unit"
grep -q "kill --kill-whom=main -s USR2 sluice.service" "$WORK/postinst" ||
    fail "postinst does not upgrade in place"
dpkg-deb -f "$DEB" Depends | grep -q "adduser" || fail "Depends lacks adduser"
step "contents ok: $(grep -c '^-' "$WORK/contents") files, 3 conffiles"

# The packaged binary runs and reports this version and commit.
mkdir -p "$WORK/x"
dpkg -x "$DEB" "$WORK/x"
"$WORK/x/usr/sbin/sluice" -V >"$WORK/version" || fail "sluice -V"
head -1 "$WORK/version" | grep -qx "sluice $VERSION" || fail "-V: $(head -1 "$WORK/version")"
grep -qx "commit: $COMMIT" "$WORK/version" || fail "-V commit is not $COMMIT"
sed 's/^/    /' "$WORK/version"

# The unit as packaged, its paths pointed into the extracted tree so verify
# finds the binary and man page; systemd-analyze only warns on bad keys,
# so any output at all is a failure.
mkdir -p "$WORK/unit"
sed "s|/usr/sbin/sluice|$WORK/x/usr/sbin/sluice|g" "$WORK/x/lib/systemd/system/sluice.service" \
    >"$WORK/unit/sluice.service"
MANPATH="$WORK/x/usr/share/man" systemd-analyze verify "$WORK/unit/sluice.service" \
    >"$WORK/verify" 2>&1 || true
if [ -s "$WORK/verify" ]; then
    cat "$WORK/verify" >&2
    fail "systemd-analyze verify"
fi
step "systemd-analyze verify: clean"

if command -v lintian >/dev/null 2>&1; then
    if ! timeout 150 lintian --fail-on error,warning "$DEB" >"$WORK/lintian" 2>&1; then
        cat "$WORK/lintian" >&2
        fail "lintian"
    fi
    grep -v "running with root privileges" "$WORK/lintian" | sed 's/^/    /' || true
    step "lintian: no errors or warnings"
else
    step "lintian not installed: skipped"
fi

# Install, reinstall and purge in a throwaway copy of this machine's root
# (overlayfs in a private mount namespace: nothing reaches the real /), to
# run the maintainer scripts for real. Skipped where mount namespaces are
# not allowed.
OVL="$WORK/ovl"
mkdir -p "$OVL/u" "$OVL/w" "$OVL/m"
cp "$DEB" "$OVL/sluice.deb"
cat >"$OVL/inside.sh" <<'INSIDE'
set -eu
export DEBIAN_FRONTEND=noninteractive
bad() { echo "install: $*" >&2; exit 1; }
dpkg -i /pkg/sluice.deb >/pkg/dpkg.log 2>&1 || { cat /pkg/dpkg.log >&2; bad "dpkg -i"; }
getent passwd sluice | grep -q ':/var/lib/sluice:/usr/sbin/nologin$' || bad "no sluice user"
[ "$(stat -c '%U:%G %a' /var/lib/sluice)" = "sluice:sluice 750" ] || bad "/var/lib/sluice"
[ "$(stat -c '%U:%G %a' /var/log/sluice)" = "sluice:adm 2750" ] || bad "/var/log/sluice"
[ "$(stat -c '%U:%G %a' /etc/default/sluice)" = "root:root 600" ] || bad "/etc/default/sluice"
[ -L /etc/systemd/system/multi-user.target.wants/sluice.service ] || bad "unit not enabled"
runuser -u sluice -- /usr/sbin/sluice -t -c /etc/sluice/sluice.yaml >/dev/null 2>&1 ||
    bad "the shipped conf does not check as the sluice user"
echo "# the operator's" >>/etc/sluice/sluice.yaml
dpkg -i --force-confold /pkg/sluice.deb >/pkg/dpkg.log 2>&1 || bad "reinstall"
[ "$(tail -1 /etc/sluice/sluice.yaml)" = "# the operator's" ] || bad "conffile replaced"
dpkg --purge sluice >/pkg/dpkg.log 2>&1 || bad "purge"
[ ! -e /var/lib/sluice ] && [ ! -e /etc/sluice ] && [ ! -e /usr/sbin/sluice ] || bad "purge left files"
INSIDE
if unshare -m true 2>/dev/null; then
    unshare -m sh -c "mount -t overlay overlay -o lowerdir=/,upperdir=$OVL/u,workdir=$OVL/w $OVL/m &&
        mount --bind /proc $OVL/m/proc && mount --bind /dev $OVL/m/dev &&
        mkdir -p $OVL/m/pkg && mount --bind $OVL $OVL/m/pkg &&
        chroot $OVL/m sh /pkg/inside.sh" || fail "install/purge in an overlay root"
    step "dpkg -i, reinstall (conffile kept), purge: ok (in an overlay root)"
else
    step "no mount namespaces here: install test skipped"
fi

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$WORK"/*.deb "$OUT"/
    echo "package: kept in $OUT"
fi
step "done"
