"""Chapter 12's figures: one line per curve in milliseconds, recompute drawn solid; both copy modes
against the block size with the link marked; rows are built by hand."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from kvlib.plotting.offload import draw_copy_bandwidth, draw_tier_ttft


def test_tier_ttft_draws_each_curve_in_milliseconds():
    fig = draw_tier_ttft({"recompute": ([0, 10], [0.1, 0.2]), "PCIe": ([0, 10], [0.05, 0.06])})
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == ["recompute", "PCIe"]
    assert list(ax.lines[0].get_ydata()) == [100.0, 200.0] and ax.lines[1].get_linestyle() == "--"
    plt.close(fig)


def test_copy_bandwidth_draws_both_modes_and_the_link():
    rows = [
        {"block_size": b, "per block: GB/s achieved": p, "per layer: GB/s achieved": 20.0}
        for b, p in ((1, 1.0), (16, 10.0))
    ]
    fig = draw_copy_bandwidth(rows, 25.0)
    (ax,) = fig.axes
    assert list(ax.lines[0].get_ydata()) == [1.0, 10.0] and list(ax.lines[1].get_ydata()) == [20.0, 20.0]
    assert list(ax.lines[2].get_ydata()) == [25.0, 25.0] and ax.get_xscale() == "log"
    plt.close(fig)
