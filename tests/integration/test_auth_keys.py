"""
test_auth_keys.py — tokens minted by an operator's login service with its
own private keys (issue 3, part 1), through the real binary: sluice holds
only the PEM public keys (ES256 P-256, RS256 2048-bit), tokens signed with
the private keys (here by the openssl CLI) are accepted, and the classic
attacks are refused: HS256 with the RS256 public key as the HMAC secret,
an alg that is not the key's pinned one, a DER (not JOSE r||s) ECDSA
signature, a signature from another key.
"""

import json
import shutil
import subprocess

import pytest

import policy_helpers as ph


def _openssl(*args, data=None):
    p = subprocess.run(["openssl"] + [str(a) for a in args], input=data, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout


@pytest.fixture
def keys(tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl CLI not installed")
    k = {}
    for name, gen in (("ec", ["ecparam", "-name", "prime256v1", "-genkey", "-noout"]),
                      ("ec_other", ["ecparam", "-name", "prime256v1", "-genkey", "-noout"]),
                      ("rsa", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])):
        priv = tmp_path / (name + ".key")
        _openssl(*(gen + ["-out", priv]))
        pub = tmp_path / (name + ".pub")
        _openssl("pkey", "-in", priv, "-pubout", "-out", pub)
        k[name] = (priv, pub)
    return k


def _der_to_raw(der):
    """ECDSA DER SEQUENCE{INTEGER r, INTEGER s} -> 64-byte r || s (JOSE)."""
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 3
    out = b""
    for _ in range(2):
        assert der[i] == 0x02
        n = der[i + 1]
        v = der[i + 2:i + 2 + n].lstrip(b"\0")
        out += v.rjust(32, b"\0")
        i += 2 + n
    return out


P256_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def _s_high(raw, high):
    """raw r || s with s in the high half (n - s) or the low half (what
    sluice accepts: docs/auth.md), whichever OpenSSL gave."""
    s = int.from_bytes(raw[32:], "big")
    if (s > P256_N // 2) != high:
        s = P256_N - s
    return raw[:32] + s.to_bytes(32, "big")


def _mint(priv, alg, kid, sub="alice", raw_sig=True, high_s=False):
    tok = ph.mint(sub, kid=kid, alg=alg)  # claims and jti as usual; the MAC is replaced
    head, body, _ = tok.access_token.split(".")
    signing_input = ("%s.%s" % (head, body)).encode()
    sig = _openssl("dgst", "-sha256", "-sign", priv, data=signing_input)
    if alg == "ES256" and raw_sig:
        sig = _s_high(_der_to_raw(sig), high_s)
    return ph.Token("%s.%s.%s" % (head, body, ph.b64url(sig)), tok.signing_key)


def _start(sluice_factory, mock, keys):
    ks = [
        {"kid": "k1", "alg": "HS256", "secret_env": ph.TOKEN_SECRET_ENV},
        {"kid": "k2", "alg": "ES256", "public_key": str(keys["ec"][1])},
        {"kid": "k3", "alg": "RS256", "public_key": str(keys["rsa"][1])},
    ]
    return ph.start(sluice_factory, mock, {"auth": {"tokens": {"keys": ks}}})


def test_es256_and_rs256_tokens_from_a_login_service(sluice_factory, mock, keys):
    s = _start(sluice_factory, mock, keys)
    for alg, kid, key in (("ES256", "k2", "ec"), ("RS256", "k3", "rsa")):
        tok = _mint(keys[key][0], alg, kid, sub="user-" + alg)
        r = ph.signed(s, tok)
        assert r.status == 200, (alg, r)
    assert ph.signed(s, ph.mint("hs-user")).status == 200
    assert len(mock.requests()) == 3
    # the high-S twin of a valid ES256 signature (it verifies too: ECDSA is
    # malleable) is refused: one signed token, one spelling
    for _ in range(2):
        r = ph.signed(s, _mint(keys["ec"][0], "ES256", "k2", sub="twin", high_s=True))
        ph.assert_auth_error(r, "token_signature")
    assert len(mock.requests()) == 3


def test_key_confusion_and_bad_signatures_refused(sluice_factory, mock, keys):
    s = _start(sluice_factory, mock, keys)
    rsa_pub = keys["rsa"][1].read_bytes()
    cases = [
        # the RS256 public key (which is public) used as an HMAC secret
        ("HS256 over the RS256 public key", "token_alg", ph.mint(kid="k3", alg="HS256", secret=rsa_pub)),
        ("HS256 over the EC public key", "token_alg",
         ph.mint(kid="k2", alg="HS256", secret=keys["ec"][1].read_bytes())),
        ("RS256 on the ES256 key", "token_alg", _mint(keys["rsa"][0], "RS256", "k2")),
        ("ES256 on the RS256 key", "token_alg", _mint(keys["ec"][0], "ES256", "k3")),
        ("ES256 by another key", "token_signature", _mint(keys["ec_other"][0], "ES256", "k2")),
    ]
    der = _mint(keys["ec"][0], "ES256", "k2", raw_sig=False)
    failures = []
    for name, reason, tok in cases:
        try:
            ph.assert_auth_error(ph.signed(s, tok), reason)
        except AssertionError as e:
            failures.append("%s: %s" % (name, str(e).splitlines()[0]))
    # a DER signature is not JOSE's r||s: refused, whichever reason names it
    r = ph.signed(s, der)
    if r.status != 401 or r.json()["error"]["code"] not in ("token_signature", "token_malformed"):
        failures.append("DER ECDSA signature: %r" % r)
    assert not failures, "\n".join(failures)
    ph.assert_upstream_untouched(mock)


def test_jwk_headers_are_not_followed(sluice_factory, mock, keys):
    """A token naming its own key (jwk / jku / x5u) is judged by the
    configured key of its kid only: signed by an attacker's key, refused."""
    s = _start(sluice_factory, mock, keys)
    pub = json.dumps({"kty": "EC", "crv": "P-256", "x": "AAAA", "y": "AAAA"})
    for extra in ({"jwk": json.loads(pub)}, {"jku": "http://127.0.0.1:1/keys"},
                  {"x5u": "http://127.0.0.1:1/cert"}):
        tok = ph.mint(kid="k2", alg="ES256", header_extra=extra)
        head, body, _ = tok.access_token.split(".")
        sig = _der_to_raw(_openssl("dgst", "-sha256", "-sign", keys["ec_other"][0],
                                   data=("%s.%s" % (head, body)).encode()))
        tok = ph.Token("%s.%s.%s" % (head, body, ph.b64url(sig)), tok.signing_key)
        ph.assert_auth_error(ph.signed(s, tok), "token_signature")
    ph.assert_upstream_untouched(mock)
