#!/bin/sh
# The installed libsfi as a program outside the tree sees it: the library,
# its headers and sfi.pc are installed into a scratch DESTDIR, then a small
# program that includes only <sfi.h> is compiled (-Werror) and linked with
# what `pkg-config --cflags --libs sfi` says (--static when only libsfi.a is
# built) and run, and one that drops an sfi_status must not compile. Fails
# on a broken sfi.pc, a header installed but missing from the umbrella
# sfi.h, a test helper installed, a library that does not link or run, or a
# status that can be ignored silently.
# Environment (set by make check): SFI_BUILDDIR, SFI_MAKE, SFI_CC,
# SFI_PKG_CONFIG, SFI_SAN_CFLAGS, SFI_SAN_LDFLAGS.
set -u
build=$(cd "${SFI_BUILDDIR:-.}" && pwd)
cc=${SFI_CC:-cc}
pkgconfig=${SFI_PKG_CONFIG:-pkg-config}
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sfi-pc-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/root

# The make of the tests may pass its jobserver in MAKEFLAGS; this one is a
# separate, serial make of three install targets.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL ${SFI_MAKE:-make} -s -C "$build" DESTDIR="$dest" \
    install-libLTLIBRARIES install-pkgincludeHEADERS install-pkgconfigDATA \
    >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "make install into DESTDIR"; }

pc=$(find "$dest" -name sfi.pc)
[ -n "$pc" ] && [ "$(printf '%s\n' "$pc" | wc -l)" -eq 1 ] || fail "sfi.pc not installed once: '$pc'"
inc=$(find "$dest" -type d -path '*/include/sfi')
[ -n "$inc" ] && [ -f "$inc/sfi.h" ] || fail "no include/sfi/sfi.h installed"
libdir=$(dirname "$(dirname "$pc")")

# The installed headers are the umbrella's includes, no more, no fewer.
for h in sfi_test_util.h sfi_hf_fixture.h; do
    [ ! -e "$inc/$h" ] || fail "test-only header $h installed"
done
(cd "$inc" && ls *.h | grep -v '^sfi\.h$' | sort) >"$tmp/installed"
sed -n 's/^#include "\(.*\)"$/\1/p' "$inc/sfi.h" | sort >"$tmp/umbrella"
cmp -s "$tmp/installed" "$tmp/umbrella" || {
    diff "$tmp/installed" "$tmp/umbrella"
    fail "installed headers (<) and sfi.h's includes (>) differ"
}

# pkg-config as a user's build would call it, with the sysroot of a staged
# install: every -I and -L it prints moves into DESTDIR, those of the
# system's packages too (absent there, so the compiler's defaults find
# them).
static=
[ -e "$libdir/libsfi.so" ] || static=--static
PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
PKG_CONFIG_SYSROOT_DIR=$dest
export PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
"$pkgconfig" --exists sfi || fail "pkg-config does not find sfi in $(dirname "$pc")"
cflags=$("$pkgconfig" --cflags sfi) || fail "pkg-config --cflags sfi"
libs=$("$pkgconfig" $static --libs sfi) || fail "pkg-config $static --libs sfi"
case " $cflags " in *" -I$inc "*) ;; *) fail "--cflags '$cflags' lacks -I$inc" ;; esac
case " $libs " in *" -L$libdir "*) ;; *) fail "--libs '$libs' lacks -L$libdir" ;; esac

cat >"$tmp/user.c" <<'EOC'
#include <sfi.h>
#include <stdio.h>

int main(void)
{
    sfi_error err;
    sfi_params p;
    sfi_model_config cfg;
    char hex[SFI_DIGEST_HEX_LEN + 1];

    sfi_error_clear(&err);
    sfi_params_default(&p);
    if (sfi_params_validate(&p, &err) != SFI_OK ||
        sfi_model_preset("Qwen3-0.6B", &cfg, &err) != SFI_OK ||
        sfi_digest_buffer_hex("abc", 3, hex, &err) != SFI_OK) {
        fprintf(stderr, "user: %s\n", err.msg);
        return 1;
    }
    printf("%d %s %s\n", cfg.num_hidden_layers, hex, sfi_status_name(SFI_EFORMAT));
    return 0;
}
EOC
# shellcheck disable=SC2086 # flags are word lists
$cc -std=c11 -Wall -Wextra -Wvla -Werror ${SFI_SAN_CFLAGS:-} $cflags -o "$tmp/user" "$tmp/user.c" \
    ${SFI_SAN_LDFLAGS:-} $libs 2>"$tmp/cc.log" || { cat "$tmp/cc.log"; fail "compile and link against <sfi.h> and $libs"; }
out=$(LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$tmp/user") || fail "the program exited non-zero"
want="28 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad format"
[ "$out" = "$want" ] || fail "the program printed '$out', not '$want'"
# A status dropped on the floor does not compile (SFI_NODISCARD, -Werror).
cat >"$tmp/drop.c" <<'EOC'
#include <sfi.h>

int main(void)
{
    sfi_model_config cfg;
    sfi_model_preset("Qwen3-0.6B", &cfg, NULL);
    return 0;
}
EOC
# shellcheck disable=SC2086
if $cc -std=c11 -Wall -Wextra -Werror $cflags -c -o "$tmp/drop.o" "$tmp/drop.c" 2>"$tmp/drop.log"; then
    fail "a program that drops an sfi_status compiled without a warning"
fi
grep -q 'unused-result\|warn_unused_result' "$tmp/drop.log" ||
    { cat "$tmp/drop.log"; fail "dropping an sfi_status failed for another reason"; }
echo "PASS: ${static:+static }libsfi from DESTDIR via pkg-config: $out"
