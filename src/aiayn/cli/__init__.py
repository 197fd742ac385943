"""The `aiayn` command: thin subcommands over the packages above, one module per command
group, and the quick start.
"""
