"""
test_obs_metrics.py — histogram `le` labels through the real binary
(issue 14): every bound is printed in its shortest exact form, so the label
an SLO query names (`{le="0.05"}`) selects the series, and the whole output
still passes `promtool check metrics`.
"""

import re

import helpers


def sig(num):
    """The significant digits of a decimal ("0.0025" -> "25", "120.0" -> "12")."""
    return re.sub(r"[eE].*$", "", num).replace(".", "").replace("-", "").strip("0")


def test_le_labels_are_shortest_exact(sluice, promtool):
    for i in range(3):
        assert sluice.chat("le %d" % i).status == 200
    text = sluice.metrics_text()
    les = re.findall(r'^(\w+)_bucket\{.*le="([^"]+)"\} \d+$', text, re.M)
    assert len(les) >= 17, les[:5]  # one histogram at least, all its bounds
    for name, le in les:
        if le == "+Inf":
            continue
        # as many significant digits as Python's shortest repr of the same
        # double (no shorter decimal reads back as it): le is as written
        assert sig(le) == sig(repr(float(le))), (name, le)
        assert len(sig(le)) <= 3, (name, le)  # the bounds the project uses
    s = sluice.metrics()
    # the series an SLO query names exists, and counts the requests made
    got = [v for _, labels, v in s.find("sluice_request_duration_seconds_bucket", le="0.05")]
    assert got, "no sluice_request_duration_seconds_bucket{le=\"0.05\"}"
    inf = sum(v for _, labels, v in s.find("sluice_request_duration_seconds_bucket", le="+Inf"))
    assert inf >= 3
    assert 'le="0.050000000000000003"' not in text
    assert 'le="0.10000000000000001"' not in text
    ok, out = helpers.promtool_check(text)
    assert ok, out
