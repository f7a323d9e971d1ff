"""Chapter 9's figure: the roof, the ridge and one point per decode form, rows built by hand."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from kvlib.plotting.mla import draw_mla_roofline


def test_roofline_draws_the_roof_the_ridge_and_each_form_under_the_roof():
    rows = [
        {"shape": "A", "form": "absorbed", "FLOPs / byte": 400.0},
        {"shape": "A", "form": "expanded", "FLOPs / byte": 1.0},
    ]
    fig = draw_mla_roofline(rows, peak_flops=200.0, bandwidth=1.0, gpu_name="G")
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and len(ax.lines) == 4
    assert list(ax.lines[1].get_xdata()) == [200.0, 200.0]  # the ridge at peak / bandwidth
    assert list(ax.lines[2].get_ydata()) == [200.0] and list(ax.lines[3].get_ydata()) == [1.0]
    assert ax.lines[3].get_label() == "A, expanded"
    plt.close(fig)
