#!/usr/bin/env python3
"""
gen_vectors.py — writes clients/vectors.json: request-signature test vectors
that every client kit (TypeScript, Kotlin, Swift, ArkTS) is checked against.

The signature in each vector comes from `sluice sign` (the gateway's own
code, auth/auth_sig.c), not from Python: a kit that agrees with these agrees
with what sluice verifies. The canonical string and the body hash are
written beside it so that a kit's failure says which step differs.

    clients/gen_vectors.py [--sluice build/sluice] [--out clients/vectors.json]
    clients/gen_vectors.py --check     # exit 1 when the file is stale

tests/integration/test_client_kits.py runs --check's logic on every run.
Stdlib only.
"""

import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KEY = "3b1f0c9e8d7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c"
CHAT = '{"model":"chat-model","messages":[{"role":"user","content":"hello"}]}'

# name, key, method, path (exactly as sent), timestamp, nonce, body bytes.
# Each case pins one rule a kit can get wrong.
CASES = [
    ("chat_post", KEY, "POST", "/v1/chat/completions", 1732900000, "q4n3lK2m8sV0xY7zR1pA5w",
     CHAT.encode()),
    ("empty_body_get", KEY, "GET", "/v1/models", 1732900001, "0123456789abcdef", b""),
    ("query_string_kept", KEY, "POST", "/v1/chat/completions?stream=true&x=a%20b", 1732900002,
     "nonce_with-dash_and_underscore", CHAT.encode()),
    ("utf8_body", KEY, "POST", "/v1/chat/completions", 1732900003, "f00dfacef00dface",
     '{"messages":[{"role":"user","content":"\u4f60\u597d \u00e9t\u00e9 \U0001f600"}]}'.encode()),
    ("binary_body", KEY, "POST", "/v1/embeddings", 1732900004, "b" * 64, bytes(range(256))),
    # The key is used as text: upper-case hex is a different key, not the same bytes.
    ("key_is_text", KEY.upper(), "POST", "/v1/chat/completions", 1732900000,
     "q4n3lK2m8sV0xY7zR1pA5w", CHAT.encode()),
    ("ten_digit_timestamp", KEY, "DELETE", "/v1/requests/abc", 9999999999, "zzzzzzzzzzzzzzzz", b""),
]


def canonical(method, path, ts, nonce, body):
    return "\n".join([method, path, str(ts), nonce, hashlib.sha256(body).hexdigest()])


def sluice_sign(sluice, key, method, path, ts, nonce, body):
    with tempfile.NamedTemporaryFile(prefix="sluice-vec-", delete=False) as f:
        f.write(body)
        name = f.name
    try:
        argv = [sluice, "sign", "--key", key, "--method", method, "--path", path, "--body", name,
                "--timestamp", str(ts), "--nonce", nonce]
        p = subprocess.run(argv, capture_output=True, timeout=30)
    finally:
        os.unlink(name)
    if p.returncode != 0:
        raise RuntimeError("sluice sign failed (%d): %s" % (p.returncode, p.stderr.decode()))
    out = {}
    for ln in p.stdout.decode().splitlines():
        k, _, v = ln.partition(":")
        out[k.strip()] = v.strip()
    if out.get("X-Sluice-Timestamp") != str(ts) or out.get("X-Sluice-Nonce") != nonce:
        raise RuntimeError("sluice sign did not echo the timestamp and nonce: %r" % out)
    return out["X-Sluice-Signature"]


def build(sluice):
    vecs = []
    for name, key, method, path, ts, nonce, body in CASES:
        v = {"name": name, "key": key, "method": method, "path": path, "timestamp": str(ts),
             "nonce": nonce}
        try:
            v["body"] = body.decode("utf-8")
        except UnicodeDecodeError:
            v["body"] = None
        v["body_b64"] = base64.b64encode(body).decode()
        v["body_sha256"] = hashlib.sha256(body).hexdigest()
        v["canonical"] = canonical(method, path, ts, nonce, body)
        v["signature"] = sluice_sign(sluice, key, method, path, ts, nonce, body)
        vecs.append(v)
    return {
        "about": "Request-signature vectors for the sluice client kits; signatures by "
                 "`sluice sign`. Regenerate: clients/gen_vectors.py",
        "headers": {"timestamp": "X-Sluice-Timestamp", "nonce": "X-Sluice-Nonce",
                    "signature": "X-Sluice-Signature"},
        "vectors": vecs,
    }


def render(doc):
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN") or
                    os.path.join(ROOT, "build", "sluice"))
    ap.add_argument("--out", default=os.path.join(ROOT, "clients", "vectors.json"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    text = render(build(a.sluice))
    if a.check:
        with open(a.out, encoding="utf-8") as f:
            if f.read() != text:
                print("%s is stale: run clients/gen_vectors.py" % a.out, file=sys.stderr)
                return 1
        return 0
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
