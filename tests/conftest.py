# The plugin is also registered by the package's pytest11 entry point; listing it here makes the
# suite work from a plain checkout (PYTHONPATH) too. Same name, so pytest registers it once.
pytest_plugins = ["scopegraph.pytest_plugin"]
