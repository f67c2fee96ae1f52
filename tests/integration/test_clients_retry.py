"""
test_clients_retry.py — the openai npm client's own retries against sluice's
answers (issue 12, item 3). The SDK retries 408/409/429/5xx unless
`x-should-retry: false`, waiting `retry-after-ms`, else `Retry-After`, else
its own backoff (node_modules/openai/client.js, shouldRetry/retryRequest).
sluice sends `x-should-retry: false` once it retried itself, and the
breaker's remaining cooldown as `Retry-After` + `retry-after-ms`, so one SDK
call no longer multiplies into retries x SDK retries upstream requests.
"""

import json
import re
import shutil
import subprocess

import pytest

import helpers
from helpers import bound

NODE_DIR = helpers.ROOT / "tests" / "integration" / "node"


@pytest.fixture(scope="session")
def openai_node(node):
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        p = subprocess.run([shutil.which("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, timeout=300)
        if p.returncode != 0:
            pytest.fail("npm ci in %s failed:\n%s" % (NODE_DIR, (p.stdout + p.stderr).decode()[-3000:]))
    return node


def run_retry(node, sluice, max_retries=2):
    p = subprocess.run(
        [node, str(NODE_DIR / "clients_retry.mjs"), "http://%s:%d/v1" % (sluice.host, sluice.port),
         str(max_retries)],
        capture_output=True, timeout=bound(60), cwd=NODE_DIR,
    )
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def retry_conf(attempts, failures, cooldown):
    return {
        "fallback": {
            "retry": {"attempts": attempts, "backoff": "10ms", "backoff_max": "20ms",
                      "budget_percent": 100, "budget_min": 100},
            "circuit": {"failures": failures, "cooldown": cooldown},
        }
    }


def test_sdk_does_not_repeat_sluices_retries(sluice_factory, mock, openai_node):
    # The upstream fails every time; its breaker stays closed (failures 50).
    sluice = sluice_factory(retry_conf(1, 50, "30s"), upstream=mock)
    mock.set_default({"status": 503})
    out = run_retry(openai_node, sluice, max_retries=2)
    assert out["error"] and out["error"]["status"] == 503, out
    # One SDK attempt: sluice's two upstream tries, then the SDK stops.
    assert len(out["attempts"]) == 1, out
    assert out["attempts"][0]["should_retry"] == "false", out
    assert len(mock.requests()) == 2  # before: 2 per SDK attempt x 3 = 6


def test_sdk_waits_for_the_breaker_cooldown(sluice_factory, mock, openai_node):
    sluice = sluice_factory(retry_conf(1, 1, "1500ms"), upstream=mock)
    mock.set_default({"status": 503})
    # One failure opens the breaker (and no retry: no server left).
    r = sluice.chat("open it")
    assert r.status == 503
    assert len(mock.requests()) == 1
    out = run_retry(openai_node, sluice, max_retries=1)
    a = out["attempts"]
    assert len(a) == 2, out
    # The open breaker: no upstream request, the wait in both headers.
    assert a[0]["status"] == 503 and a[0]["should_retry"] is None, out
    wait_ms = int(a[0]["retry_after_ms"])
    assert 0 < wait_ms <= 1500, out
    assert int(a[0]["retry_after"]) == (wait_ms + 999) // 1000, out
    # The SDK slept that long: its retry is the half-open probe.
    assert a[1]["at"] - a[0]["at"] >= wait_ms - 50, out
    assert len(mock.requests()) == 2, out  # the probe only
    # The probe failed: the relayed 503 says to wait again (the head goes
    # out before the probe's result reaches the breaker: the probe wait).
    assert a[1]["status"] == 503 and int(a[1]["retry_after_ms"]) >= 1000, out


def test_429_carries_openai_names_and_retry_after_ms(sluice_factory, mock):
    # A burst of 2, then one a minute (docs/ratelimit.md: GCRA).
    sluice = sluice_factory({"ratelimit": {"per_ip": {"requests_per_minute": 2}}}, upstream=mock)
    ok = sluice.chat("one")
    assert ok.status == 200
    assert ok.header("x-ratelimit-limit-requests") == "2"
    assert ok.header("x-ratelimit-remaining-requests") == "1"
    assert ok.header("x-ratelimit-reset-requests").endswith("s")  # "30s", "29.998s"
    assert ok.header("X-RateLimit-Limit") == "2"  # deprecated name, still sent
    assert sluice.chat("two").status == 200
    r = sluice.chat("three")
    assert r.status == 429
    wait_ms = int(r.header("retry-after-ms"))
    assert 25000 < wait_ms <= 30000, r.header("retry-after-ms")
    assert int(r.header("Retry-After")) == (wait_ms + 999) // 1000
    assert r.header("x-ratelimit-remaining-requests") == "0"
    reset = r.header("x-ratelimit-reset-requests")
    assert re.fullmatch(r"(1m0s|[1-5]?[0-9](\.[0-9]{1,3})?s)", reset), reset  # Go duration
    assert json.loads(r.body)["error"]["code"] == "rate_limit_exceeded"
    assert len(mock.requests()) == 2
