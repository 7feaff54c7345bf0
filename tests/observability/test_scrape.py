import math

from aieng.observability.scrape import delta, histogram_quantile, parse

TEXT = """# HELP x_seconds help
# TYPE x_seconds histogram
x_seconds_bucket{le="0.1",p="a"} 1.0
x_seconds_bucket{le="1.0",p="a"} 3.0
x_seconds_bucket{le="+Inf",p="a"} 4.0
x_seconds_count{p="a"} 4.0
x_seconds_sum{p="a"} 2.5
# HELP r_total help
# TYPE r_total counter
r_total{code="200"} 5.0
r_total{code="500"} 1.0
"""


def test_parse_values_labels_and_quantiles():
    snap = parse(TEXT)
    assert snap.value("r_total") == 6 and snap.value("r_total", code="500") == 1
    assert snap.by_label("r_total", "code") == {"200": 5.0, "500": 1.0}
    assert snap.mean("x_seconds") == 2.5 / 4
    assert math.isclose(snap.quantile("x_seconds", 0.5), 0.1 + 0.9 * 0.5)
    assert snap.quantile("x_seconds", 0.99) == 1.0  # rank falls in +Inf: the last finite bound


def test_quantile_of_empty_histogram_is_nan_and_delta_subtracts_counters():
    assert math.isnan(histogram_quantile(0.5, []))
    later = parse(TEXT.replace('r_total{code="200"} 5.0', 'r_total{code="200"} 9.0'))
    assert delta(parse(TEXT), later).value("r_total", code="200") == 4
