"""The command line's commands (private): ``info``, ``demo``, ``bench``, and the seed's layer stack
that the demo, the benchmarks and the tests run. ``scopegraph.__main__`` parses the arguments.
Nothing here is public API.
"""
