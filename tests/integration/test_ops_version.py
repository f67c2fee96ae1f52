"""
test_ops_version.py — `sluice -V` (issue 13, item 7): each line of the report,
in order, and each value checked against an independent source: the
Makefile's VERSION and debian/changelog, the repository's commits, the build
(sanitizer flags iff a san build), and the versions the system's libraries
report through pkg-config, Python's ssl module and dpkg.
"""

import os
import re
import shutil
import ssl
import subprocess

import pytest

from helpers import ROOT

KEYS = [
    "commit",
    "compiler",
    "build flags",
    "libevent",
    "OpenSSL",
    "jansson",
    "PCRE2",
    "hiredis",
    "libyaml",
    "http-parser",
    "nghttp2",
    "yajl",
]


def run_v(sluice_bin, flag="-V"):
    p = subprocess.run([sluice_bin, flag], capture_output=True, timeout=10)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode()


@pytest.fixture(scope="module")
def report(sluice_bin):
    text = run_v(sluice_bin)
    lines = text.splitlines()
    assert len(lines) == 1 + len(KEYS), text
    fields = {}
    for ln, key in zip(lines[1:], KEYS):
        k, sep, v = ln.partition(": ")
        assert sep and k == key, "line %r, want key %r" % (ln, key)
        assert v.strip() == v and v, ln
        fields[k] = v
    return lines[0], fields


def pkg_version(name):
    exe = shutil.which("pkg-config")
    if not exe:
        pytest.skip("pkg-config not installed")
    p = subprocess.run([exe, "--modversion", name], capture_output=True, timeout=10)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode().strip()


def test_version_matches_makefile_and_changelog(report):
    first, _ = report
    mk = re.search(r"^VERSION\s*:=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert mk, "Makefile has no VERSION"
    assert first == "sluice " + mk.group(1)
    top = (ROOT / "debian" / "changelog").read_text().splitlines()[0]
    m = re.match(r"^sluice \(([^)]+)\) ", top)
    assert m, top
    assert m.group(1) == mk.group(1), "debian/changelog and Makefile VERSION differ"
    th = [ln for ln in (ROOT / "docs" / "sluice.8").read_text().splitlines() if ln.startswith(".TH ")]
    assert len(th) == 1 and '"sluice %s"' % mk.group(1) in th[0], th


def test_long_option_prints_the_same(sluice_bin, report):
    first, fields = report
    text = run_v(sluice_bin, "--version")
    assert text.splitlines()[0] == first
    assert text == run_v(sluice_bin, "-V")


def test_commit_is_one_of_this_repository(report):
    commit = report[1]["commit"]
    m = re.fullmatch(r"([0-9a-f]{12})(-dirty)?", commit)
    assert m, commit
    if not shutil.which("git") or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    p = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-t", m.group(1)], capture_output=True, timeout=10
    )
    assert p.stdout.decode().strip() == "commit", "-V names %s, not a commit here" % commit


def test_build_flags_say_how_it_was_built(report):
    flags = report[1]["build flags"]
    assert re.search(r"(^| )-O[0-3sg]( |$)", flags), flags
    san = "san" in os.path.basename(os.environ.get("SLUICE_BUILD", "build"))
    assert ("-fsanitize=address,undefined" in flags) == san, flags
    assert "-ffile-prefix-map" not in flags  # build paths are left out
    assert re.fullmatch(r"(gcc|clang) \S.*", report[1]["compiler"]), report[1]["compiler"]


def test_libevent(report):
    assert report[1]["libevent"] == pkg_version("libevent")


def test_openssl_is_the_loaded_library(report):
    # Python's ssl module loads the same system libssl3.
    assert report[1]["OpenSSL"] == ssl.OPENSSL_VERSION


def test_jansson(report):
    assert report[1]["jansson"] == pkg_version("jansson")


def test_pcre2_with_jit_state(report):
    v = report[1]["PCRE2"]
    m = re.fullmatch(r"(\S+) \d{4}-\d\d-\d\d \(JIT (yes|no)\)", v)
    assert m, v
    assert m.group(1) == pkg_version("libpcre2-8")


def test_hiredis_headers_and_loaded_file(sluice_bin, report):
    v = report[1]["hiredis"]
    m = re.fullmatch(r"(\S+) \(headers; loaded (\S+)\)", v)
    assert m, v
    assert m.group(1) == pkg_version("hiredis")
    ldd = subprocess.run(["ldd", sluice_bin], capture_output=True, timeout=10).stdout.decode()
    assert re.search(r"^\s*%s =>" % re.escape(m.group(2)), ldd, re.M), (m.group(2), ldd)


def test_libyaml(report):
    assert report[1]["libyaml"] == pkg_version("yaml-0.1")


def test_http_parser(report):
    v = report[1]["http-parser"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", v), v
    p = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "libhttp-parser-dev"], capture_output=True, timeout=10
    )
    if p.returncode != 0:
        pytest.skip("libhttp-parser-dev is not a dpkg package here")
    assert p.stdout.decode().startswith(v + "-"), (v, p.stdout)


def test_nghttp2(report):
    # The loaded library's nghttp2_version(0)->version_str.
    assert report[1]["nghttp2"] == pkg_version("libnghttp2")


def test_yajl(report):
    assert report[1]["yajl"] == pkg_version("yajl")
