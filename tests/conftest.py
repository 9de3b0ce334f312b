# The suite opts in to scopegraph's pytest plugin, as a user's project does (it is not registered globally).
pytest_plugins = ["scopegraph.pytest_plugin"]
