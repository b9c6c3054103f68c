"""Sphinx configuration of the course website (`make site`; sources assembled by build.py).

The notebooks are shown as stored, executed by `make notebooks`: myst-nb never runs them."""

project = "lib_dist"
author = "the lib_dist authors"
copyright = "the lib_dist authors"
extensions = ["myst_nb"]
nb_execution_mode = "off"  # the stored outputs are the ones a CPU run produced
nb_merge_streams = True
myst_enable_extensions = ["dollarmath"]
html_theme = "alabaster"
html_title = "lib_dist: distributed training, run on a laptop"
html_theme_options = {"description": "How large language models are trained across many GPUs",
                      "fixed_sidebar": True}
html_sidebars = {"**": ["about.html", "navigation.html", "searchbox.html"]}
exclude_patterns = ["_build"]
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header"]
