"""One module per `kit` subcommand; kit/cli.py is the registry."""
