"""Plots are Pillow images of the search (from a result or a state dict) and of a profile."""
from PIL import Image
from test_search_bilevel import CFG, Evaluator, make_profile

from gcache.search.config import SearchConfig
from gcache.search.infra.plots import plot_profile, plot_search
from gcache.search.loop import run_search


def test_plots_render():
    prof = make_profile()
    res = run_search(prof, SearchConfig(**CFG), Evaluator(prof))
    for img in (plot_search(res), plot_search(res.state), plot_profile(prof)):
        assert isinstance(img, Image.Image) and img.mode == "RGB" and img.width > 100 and img.height > 100
        assert len(img.resize((64, 64)).getcolors(4096)) > 3  # something was drawn
